"""Files in and out: typed configs from YAML and flags (``schema``), the bundled configs and assets
(``bundled``), videos (``video``), prompt files (``prompts``) and how a CLI ends (``cli``)."""
