"""Why a video VAE is decoded by one process of a sample (the "leader decode" of the README's family table).

A VAE runs split (``dit_sp.vae.split``) when a family registers a ``VAEPlan`` for its class; every other VAE of a
supported pipeline is decoded whole by the sample's leader. Each such class has its reason here, read from its
diffusers code: ``dit_sp.zoo.table`` prints them under the table, and ``tests/zoo/test_vae_leader_reasons.py``
checks that every leader-decode VAE of the table has one (and that none is left for a VAE that runs split). Every
video VAE of the supported pipelines in diffusers 0.42.1 runs split now (the last, Kandinsky 6 SR's K-VAE, by rows:
``dit_sp.families.kandinsky6_sr``), so none is listed.
"""

from __future__ import annotations

LEADER_DECODE_REASONS: dict[str, str] = {}
"""The reason each leader-decode VAE class is not split, by class name (one line each)."""
