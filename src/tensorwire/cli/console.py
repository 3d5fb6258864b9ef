"""The console every command prints to."""

import shutil

from rich.console import Console

# Tables are wide: off a terminal (CI logs, pipes) print them 160 columns wide, not rich's 80.
console = Console(width=shutil.get_terminal_size((160, 24)).columns)
