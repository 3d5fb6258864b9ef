"""The consoles every command prints to: results on standard output, errors and log lines
on standard error."""

import shutil

from rich.console import Console

# Tables are wide: off a terminal (CI logs, pipes) print them 160 columns wide, not rich's 80.
console = Console(width=shutil.get_terminal_size((160, 24)).columns)
err_console = Console(stderr=True, width=shutil.get_terminal_size((160, 24)).columns)
