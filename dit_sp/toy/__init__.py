"""The synthetic shape world (``world``: clips, prompts, pixel-level faithfulness) and the tiny ``toy-wan``
model trained on it (``model``)."""
