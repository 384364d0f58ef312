# Makes conf/ the package ``attnbench.conf`` in the wheel (see pyproject.toml), so the
# Hydra configs and device presets ship with a non-editable install.
