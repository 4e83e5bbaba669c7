"""Machine profiles shipped with plexus-tune (one JSON file each; see docs/profiles.md).

Installed as the package ``plexus_tune.profiles``; ``plexus_tune.model.machine.models_dirs``
finds this directory with :mod:`importlib.resources`.
"""
