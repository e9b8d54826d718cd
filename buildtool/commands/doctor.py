"""Placeholder so the CLI imports while this command is being written."""

import typer


def register(app: typer.Typer) -> None:
    pass
