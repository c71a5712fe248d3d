"""Settings files: one YAML per paper row, and how a settings file or a run's config.json is read back into a
Config (config_file.py)."""
