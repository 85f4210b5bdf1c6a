"""Progress of local workflow runs in the terminal: one line per step, a bar while training."""

from __future__ import annotations

import threading
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

STATUS_STYLE = {"succeeded": "green", "cached": "cyan", "failed": "red", "running": "yellow"}


class StepProgress:
    """A progress callback for the local target's executor, drawing rich progress bars."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("  {task.description}"), BarColumn(bar_width=30), TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(), console=console, transient=False,
        )
        self.tasks: dict[tuple[str, str], TaskID] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _task(self, workflow: str, step: str) -> TaskID:
        key = (workflow, step)
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(f"{step:<26}", total=None, detail="")
        return self.tasks[key]

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            kind = event.get("event")
            if kind == "workflow":
                self.progress.console.print(f"[bold]Workflow[/bold] {event['workflow']}: {' → '.join(event['steps'])}")
                return
            step = event.get("task")
            if not step or kind not in ("step", "progress", "retry", "reaped"):
                return
            task = self._task(event["workflow"], step)
            if kind == "step":
                status = event.get("status", "")
                style = STATUS_STYLE.get(status, "white")
                detail = f"[{style}]{status}[/{style}]"
                if status == "cached":
                    detail += " (cache hit)"
                if status == "failed":
                    detail += f" exit {event.get('exit')}: {event.get('message', '')[:80]}"
                done = status in ("succeeded", "cached", "failed")
                self.progress.update(task, detail=detail, total=1 if done else None, completed=1 if done else 0)
            elif kind == "progress" and event.get("total"):
                loss = event.get("loss")
                detail = f"step {event['step']}/{event['total']}" + (f" loss {loss:.4f}" if isinstance(loss, (int, float)) else "")
                self.progress.update(task, total=event["total"], completed=event["step"], detail=detail)
            elif kind == "retry":
                self.progress.update(task, detail=f"[yellow]retry {event['attempt']} in {event['in']:.0f}s[/yellow]")
            elif kind == "reaped":
                self.progress.console.print(f"  stopped a leftover run of {step} (pid {event['pid']}); starting it again")
