"""``python -m lightning_zerocopy`` runs the ``lightning-zerocopy`` command."""

from lightning_zerocopy.cli import main

if __name__ == "__main__":
    main()
