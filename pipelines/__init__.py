"""Runnable entry points of dit-sp (``python -m pipelines.<name>``)."""
