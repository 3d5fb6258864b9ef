"""The ``tensorwire`` command (see ``tensorwire.cli.app``)."""
