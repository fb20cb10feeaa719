"""The docs site's reference pages, generated from the code (``scripts/gen-docs``; no command of the CLI).

One module per page: :mod:`~sparkserve.docgen.cli`, :mod:`~sparkserve.docgen.config`,
:mod:`~sparkserve.docgen.schemas`, :mod:`~sparkserve.docgen.faults` (with
:mod:`~sparkserve.docgen.first_contact`), assembled by :mod:`~sparkserve.docgen.gen`. It stands above
``commands/`` (it reads the Typer app), and nothing in the CLI imports it.

May import: everything (it reads the Typer app and the words the code prints)."""
