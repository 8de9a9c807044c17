"""Memory planning: what each GPU holds for a run on a layout, before the OOM (``planner``)."""
