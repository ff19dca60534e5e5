"""``python -m ebpo.integrations.verl <hydra overrides>``: see :mod:`ebpo.integrations.verl.main`."""

from ebpo.integrations.verl.main import main

main()
