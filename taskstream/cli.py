"""The `taskstream` command: run the embedded stack, submit DAGs, watch them, audit their history."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from taskstream.core.model import TERMINAL as TERMINAL_STATUSES
from taskstream.settings import Settings, SettingsError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
graph_app = typer.Typer(no_args_is_help=True, help="Ask the dependency graph (Ladybug or Neo4j).")
app.add_typer(graph_app, name="graph")
serve_app = typer.Typer(hidden=True, help="Run one service in the foreground (the supervisor uses these).")
app.add_typer(serve_app, name="serve")
schedule_app = typer.Typer(
    no_args_is_help=True, help="Schedules: a DAG submitted at every time a cron expression names."
)
app.add_typer(schedule_app, name="schedule")
dlq_app = typer.Typer(
    no_args_is_help=True, help="Dead letters: tasks whose retries ran out, and records nobody could decode."
)
app.add_typer(dlq_app, name="dlq")
tenants_app = typer.Typer(
    invoke_without_command=True,
    help="Tenants: each with its tier, cap and weight (`tenants` lists them; `tenants set` creates or changes one).",
)
app.add_typer(tenants_app, name="tenants")
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]
console = Console(highlight=False)
err = Console(stderr=True, highlight=False)
TERMINAL = frozenset(st.value for st in TERMINAL_STATUSES)  # status names as the read model stores them
STYLE = {
    "SUCCEEDED": "green",
    "DEAD_LETTERED": "red",
    "CANCELLED": "yellow",
    "REJECTED": "red",
    "RUNNING": "cyan",
    "RETRY_WAIT": "magenta",
}


def settings(probe: bool = True) -> Settings:
    """The settings from TASKSTREAM_*, with the engines chosen (connectors/engines.py)."""
    from taskstream.connectors.engines import choose

    try:
        return choose(Settings.from_env(), probe=probe).settings
    except SettingsError as exc:
        err.print(f"[red]error:[/] {lit(exc)}")
        raise typer.Exit(2) from exc


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/] {lit(message)}")
    raise typer.Exit(code)


def lit(value: Any) -> str:
    """`value` as text that prints literally: markup escaped (a task's output holding `[/x]` made rich
    raise, and `[red]` styled it), control characters other than newline and tab shown as `\\xNN` (an
    escape sequence in an output tail would otherwise style or move the reader's terminal)."""
    return escape(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value)))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# ---- up / down ---------------------------------------------------------------------------------------


@app.command()
def up(timeout: Annotated[float, typer.Option(help="seconds to wait for every service")] = 240.0) -> None:
    """Start the embedded stack (Kafka, PostgreSQL, registry, Neo4j, projectors, admission, workers) under the
    state directory. Without a JVM: noida-db and Ladybug instead (TASKSTREAM_BROKER, TASKSTREAM_GRAPH_BACKEND
    choose explicitly)."""
    from taskstream import supervisor as sup
    from taskstream.connectors import engines
    from taskstream.connectors import services as sv
    from taskstream.connectors.jvm import JvmError

    try:
        choice = engines.choose(Settings.from_env())
    except SettingsError as exc:
        fail(str(exc), 2)
    s = choice.settings
    status = sup.read_status(s)
    if status and sup.pid_alive(status["pid"]) and status["status"] in ("starting", "ready"):
        console.print(f"taskstream is already up (supervisor pid {status['pid']}, state {s.state_dir})")
        return
    if choice.note:
        err.print(f"[yellow]note:[/] {escape(choice.note)}")
    try:
        engines.check_record(s)
        with console.status("checking the JVM engines…") as spinner:
            engines.prepare_jvm(s, _progress(spinner))
        specs = sv.embedded_specs(s)
    except (sv.ServiceError, JvmError, engines.EngineError) as exc:
        fail(str(exc))
    for spec in specs:
        for what, port in spec.ports:
            if not sv.port_free(s.host, port):
                fail(
                    f"port {port} on {s.host} ({what}) is taken: stop what uses it or set another port "
                    f"(TASKSTREAM_*_PORT)"
                )
    engines.record(s)
    for d in (sv.run_dir(s), sv.log_dir(s)):
        d.mkdir(parents=True, exist_ok=True)
    sup.status_file(s).unlink(missing_ok=True)
    log = open(sv.log_dir(s) / "supervisor.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(  # noqa: S603 - argv list
        [sys.executable, "-m", "taskstream", "serve", "supervisor"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **s.env()},
        start_new_session=True,
    )
    log.close()
    console.print(f"engines: {engines.describe(s)}")
    deadline = time.monotonic() + timeout
    with console.status("starting taskstream…") as spinner:
        while time.monotonic() < deadline:
            st = sup.read_status(s) or {}
            if st.get("status") in ("failed", "stopped") or proc.poll() is not None:
                proc.wait(60)
                st = sup.read_status(s) or {}
                fail(f"start-up failed: {st.get('error') or 'see ' + str(sv.log_dir(s) / 'supervisor.log')}")
            if st.get("status") == "ready":
                break
            starting = [n for n, v in st.get("services", {}).items() if v.get("pid")]
            spinner.update(f"starting taskstream… {starting[-1] if starting else ''}")
            time.sleep(0.3)
        else:
            proc.send_signal(signal.SIGTERM)
            fail(f"not ready within {timeout:.0f}s; logs in {sv.log_dir(s)}")
    _print_services(s)


def _progress(spinner: Any) -> Any:
    """Where jar resolution reports: the spinner on a terminal; elsewhere (CI logs, pipes) plain lines,
    the first, every 25th download and the last."""
    if console.is_terminal:
        return lambda line: spinner.update(escape(line))
    shown = [0]

    def line(text: str) -> None:
        n = int(text.rsplit(": ", 1)[-1].split()[0]) if text.endswith("downloaded") and ": " in text else 0
        if n == 0 or n - shown[0] >= 25:
            shown[0] = n
            console.print(escape(text))

    return line


def _print_services(s: Settings) -> None:
    from taskstream import supervisor as sup

    st = sup.read_status(s) or {}
    t = Table(title=f"taskstream {st.get('status', 'down')} · state {s.state_dir}")
    for col in ("service", "pid", "alive", "restarts"):
        t.add_column(col)
    for name, v in st.get("services", {}).items():
        alive = bool(v.get("pid")) and sup.pid_alive(v["pid"])
        t.add_row(name, str(v.get("pid") or "-"), "yes" if alive else "[red]no[/]", str(v.get("restarts", 0)))
    console.print(t)
    graph = s.neo4j_url if s.graph_backend == "neo4j" else f"Ladybug via {s.graph_url}"
    console.print(
        f"Kafka {s.bootstrap} · registry {s.registry} · PostgreSQL {s.dsn.split(' connect_timeout')[0]} · graph {graph}"
    )


@app.command()
def down(timeout: Annotated[float, typer.Option(help="seconds to wait before killing")] = 90.0) -> None:
    """Stop the embedded stack. Its data stays in the state directory for the next `up`."""
    from taskstream import supervisor as sup

    s = settings()
    st = sup.read_status(s)
    if not st or not sup.pid_alive(st["pid"]):
        _kill_leftovers(st)
        console.print("taskstream is not running")
        return
    os.kill(st["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    with console.status("stopping taskstream…"):
        while sup.pid_alive(st["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
    if sup.pid_alive(st["pid"]):
        os.kill(st["pid"], signal.SIGKILL)
        _kill_leftovers(st)
    console.print("taskstream stopped")


def _kill_leftovers(st: dict[str, Any] | None) -> None:
    from taskstream import supervisor as sup

    for v in (st or {}).get("services", {}).values():
        pid = v.get("pid")
        if pid and sup.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


# ---- submit ------------------------------------------------------------------------------------------


def load_document(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", 2)
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        fail(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}", 2)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        fail(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}", 2)


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="a DAG as YAML or JSON (see examples/)")],
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="watch it until every task ends")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for admission (and, with --follow, the end)")] = 600,
) -> None:
    """Submit a DAG of tasks. Exit status: 0 accepted (and, with --follow, all succeeded), 1 otherwise, 2 bad file."""
    from taskstream.core.submission import SubmissionError, parse_document

    try:
        sub = parse_document(load_document(file), str(file))
    except SubmissionError as exc:
        _bad_file(file, exc)
    s = settings()
    sid, outcome = _decided(s, lambda client: client.submit(sub), min(timeout, 120))
    if not outcome.accepted:
        _refused(f"submission {sid}", outcome.errors, "submission")
    console.print(f"[green]accepted[/] submission {sid}: {len(outcome.task_ids)} task(s)")
    if not follow:
        for name, tid in outcome.task_ids.items():
            console.print(f"  {lit(name)}  {tid}")
        return
    ok = follow_submission(s, sid, timeout, tasks=len(outcome.task_ids))
    raise typer.Exit(0 if ok else 1)


def _decided(s: Settings, send: Any, timeout: float) -> tuple[str, Any]:
    """Send a command deciding a submission (`send(client)` -> (command id, submission id)) and wait for
    admission's decision: (submission id, Outcome); a broker or registry out of reach ends the command."""
    from taskstream.sdk import Client, SubmitError

    try:
        with Client(s, issuer=f"cli:{os.environ.get('USER', 'user')}") as client:
            command_id, sid = send(client)
            return sid, client.wait_outcome(sid, timeout=timeout, command_id=command_id)
    except SubmitError as exc:
        fail(str(exc))


def _bad_file(file: Path, exc: Any) -> NoReturn:
    """A file refused before anything was sent: every problem, then exit status 2."""
    err.print(f"[red]error:[/] {lit(file)}: {len(exc.errors)} problem(s):")
    for e in exc.errors:
        err.print(f"  - {lit(e)}")
    raise typer.Exit(2) from exc


def _refused(what: str, problems: list[dict[str, Any]], whole: str) -> NoReturn:
    """Admission's rejection of `what` (markup already escaped): each problem by task and field (or by
    `whole`, for one about all of it), then exit status 1."""
    err.print(f"[red]rejected:[/] {what}:")
    for problem in problems:
        where = f"task {problem['task']!r}" if problem.get("task") else whole
        err.print(f"  - {lit(where)}, field {lit(repr(problem['field']))}: {lit(problem['reason'])}")
    raise typer.Exit(1)


def _rows(conn: Any, sid: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT name, status, attempt, exit_code, started_at, finished_at, reason, task_id FROM tasks "
        "WHERE submission_id = %s ORDER BY name",
        (sid,),
    ).fetchall()


def follow_submission(s: Settings, sid: str, timeout: float, tasks: int | None = None) -> bool:
    """Show progress until every task of the submission is terminal; print a summary; True if all succeeded.
    `tasks`: how many it has (the decision says; PostgreSQL may not show them all yet)."""
    import psycopg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        rows = _rows(conn, sid)
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            bar = progress.add_task("running", total=tasks or len(rows) or None)
            while time.monotonic() < deadline:
                rows = _rows(conn, sid)
                for name, status, attempt, *_ in rows:
                    if seen.get(name) != status:
                        seen[name] = status
                        style = STYLE.get(status, "white")
                        progress.console.print(f"  {lit(f'{name:<24}')} [{style}]{status}[/] (attempt {attempt})")
                done = sum(1 for r in rows if r[1] in TERMINAL)
                counts: dict[str, int] = {}
                for r in rows:
                    counts[r[1]] = counts.get(r[1], 0) + 1
                progress.update(
                    bar,
                    total=max(len(rows), tasks or 0),
                    completed=done,
                    description=" ".join(f"{k.lower()}:{v}" for k, v in sorted(counts.items())),
                )
                if rows and done == len(rows) and (tasks is None or len(rows) >= tasks):
                    break
                time.sleep(0.3)
        rows = _rows(conn, sid)
    t = Table(title=f"submission {sid}")
    for col in ("task", "status", "attempts", "exit", "took", "why"):
        t.add_column(col)
    for name, status, attempt, code, started, finished, reason, _tid in rows:
        took = f"{(finished - started).total_seconds():.2f}s" if started and finished else "-"
        t.add_row(
            lit(name),
            f"[{STYLE.get(status, 'white')}]{status}[/]",
            str(attempt),
            "-" if code is None else str(code),
            took,
            lit(reason or ""),
        )
    console.print(t)
    all_ok = bool(rows) and all(r[1] == "SUCCEEDED" for r in rows)
    if not all(r[1] in TERMINAL for r in rows):
        err.print(f"[yellow]not finished within {timeout:.0f}s[/]")
    return all_ok


# ---- status / audit ----------------------------------------------------------------------------------


@app.command()
def status(task: Annotated[str | None, typer.Argument(help="a task id; omit for an overview")] = None) -> None:
    """Show the stack and task counts, or one task with its attempts."""
    s = settings()
    with _read_model(s) as conn:
        if task is None:
            if s.embedded_kafka:
                _print_services(s)
            t = Table(title="tasks by status")
            t.add_column("status")
            t.add_column("count", justify="right")
            for st, n in conn.execute("SELECT status, count(*) FROM tasks GROUP BY status ORDER BY status"):
                t.add_row(f"[{STYLE.get(st, 'white')}]{st}[/]", str(n))
            console.print(t)
            _print_lag(s)
            return
        row = conn.execute(
            "SELECT name, tenant, status, version, attempt, worker, exit_code, reason, argv, "
            "submission_id, dependencies FROM tasks WHERE task_id::text = %s",
            (task,),
        ).fetchone()
        if row is None:
            fail(f"no task {task} in the read model (it may not be projected yet; try `taskstream audit {task}`)")
        name, tenant, st, version, attempt, worker, code, reason, argv, sid, deps = row
        console.print(f"task {lit(task)} [bold]{lit(name)}[/] (tenant {lit(tenant)}, submission {sid})")
        console.print(
            f"  status [{STYLE.get(st, 'white')}]{st}[/] · version {version} · attempt {attempt} · "
            f"worker {lit(worker or '-')} · exit {code if code is not None else '-'}"
        )
        console.print(f"  argv {lit(argv)}")
        if deps:
            console.print(f"  depends on {', '.join(str(d) for d in deps)}")
        if reason:
            console.print(f"  why: {lit(reason)}")
        t = Table(title="attempts")
        for col in ("#", "worker", "started", "ended", "exit", "outcome", "output (tail)"):
            t.add_column(col)
        for n, w, started, ended, ec, outcome, tail in conn.execute(
            "SELECT attempt, worker, started_at, ended_at, exit_code, outcome, output_tail FROM attempts "
            "WHERE task_id::text = %s ORDER BY attempt",
            (task,),
        ):
            t.add_row(
                str(n),
                lit(w or "-"),
                str(started or "-"),
                str(ended or "-"),
                "-" if ec is None else str(ec),
                outcome or "-",
                lit((tail or "").strip()[-200:]),
            )
        console.print(t)


def _read_model(s: Settings) -> Any:
    """A connection to the PostgreSQL read model, or a one-line error saying it cannot be reached."""
    import psycopg

    try:
        return psycopg.connect(s.dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"cannot reach PostgreSQL at {s.dsn.split(' connect_timeout')[0]} (is the stack up?): {first}")


def _print_lag(s: Settings) -> None:
    from taskstream.projections.graph_service import graph_queries
    from taskstream.projections.lag import graph_checkpoints, pg_checkpoints, projection_lag

    topic = s.topic("events")
    try:
        graph: dict[int, int] | None = graph_checkpoints(graph_queries(s).checkpoints(), topic)
    except OSError:
        graph = None
    rows = projection_lag(s, pg_checkpoints(s.dsn, topic), graph)
    t = Table(title=f"projection lag on {topic}" + ("" if graph is not None else " (graph service unreachable)"))
    for col in ("projection", "partition", "checkpoint", "log end", "behind"):
        t.add_column(col, justify="right" if col != "projection" else "left")
    for r in rows:
        behind = f"[yellow]{r.behind}[/]" if r.behind else "0"
        t.add_row(
            r.projection, str(r.partition), "-" if r.checkpoint is None else str(r.checkpoint), str(r.log_end), behind
        )
    console.print(t)


@app.command()
def cluster(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """The submitter cluster: admission workers, the commands partitions each owns, admissions in flight."""
    from taskstream.connectors.cluster import describe

    try:
        view = describe(settings())
    except Exception as exc:  # broker down: say so in one line
        fail(f"cannot read the cluster's state from Kafka: {exc}")
    if as_json:
        print(json.dumps(view))
        return
    t = Table(title="admission workers")
    for col in ("member", "pid", "alive", "last heard", "owns", "in flight", "decided", "accepted", "rejected"):
        t.add_column(col)
    for m in view["members"]:
        fl = m["in_flight"]
        flight = f"p{fl['partition']} @{fl['first_offset']}-{fl['last_offset']} ({fl['commands']})" if fl else "-"
        t.add_row(
            m["member"],
            str(m["pid"]),
            "[green]yes[/]" if m["alive"] else f"[red]no[/] ({m['state']})",
            f"{m['silent_ms'] / 1000:.1f}s ago",
            ",".join(str(p) for p in m["owned"]) or "-",
            flight,
            str(m["decided"]),
            str(m["accepted"]),
            str(m["rejected"]),
        )
    console.print(t)
    pt = Table(title="commands partitions")
    for col in ("partition", "owner", "committed", "log end", "not yet committed"):
        pt.add_column(col)
    for p in view["partitions"]:
        pt.add_row(
            str(p["partition"]), p["owner"] or "[red]none[/]", str(p["committed"]), str(p["end"]), str(p["backlog"])
        )
    console.print(pt)
    for m in view["members"]:
        for tk in m["takeovers"]:
            when = time.strftime("%H:%M:%S", time.localtime(tk["at_ms"] / 1000))
            console.print(
                f"{when} {m['member']} took over partition {tk['partition']} from {tk['from']}"
                f" ({tk['orphaned']} command(s) not yet committed)"
            )


@app.command()
def audit(
    task: Annotated[str, typer.Argument(help="a task id")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per event")] = False,
) -> None:
    """Every event of one task, read from the event log (not from a projection), in order."""
    from taskstream.connectors.audit import task_history

    s = settings()
    try:
        history = task_history(s, task)
    except Exception as exc:
        fail(f"cannot read the event log at {s.bootstrap}: {exc}")
    if not history:
        fail(f"no events for task {task} in {s.topic('events')}")
    if as_json:
        for h in history:
            console.print_json(json.dumps(h, default=str)) if sys.stdout.isatty() else print(json.dumps(h, default=str))
        return
    t = Table(title=f"history of task {task}")
    for col in ("v", "event", "event time", "log time", "by", "details"):
        t.add_column(col)
    for h in history:
        t.add_row(*(lit(h[k]) for k in ("version", "event", "event_time", "log_time", "node", "details")))
    console.print(t)


# ---- cancel / reprioritize -----------------------------------------------------------------------------


@app.command()
def cancel(
    task: Annotated[str, typer.Argument(help="a task id")],
    reason: Annotated[str, typer.Option(help="why, recorded with the cancellation")] = "",
    timeout: Annotated[float, typer.Option(help="seconds to wait for the cancellation to be recorded")] = 30.0,
) -> None:
    """Cancel a task. One not yet running never runs; a running one's process group gets SIGTERM, then
    SIGKILL after kill_grace_ms, and its run is recorded as killed. Its dependents end cancelled too.
    Exit status: 0 cancelled, 1 unknown or already ended (or it ended first), 2 not recorded in time."""
    from taskstream.sdk import Client, SubmitError

    s = settings()
    try:
        with Client(s, issuer=f"cli:{os.environ.get('USER', 'user')}") as client:
            before = client.task(task)
            client.cancel(task, reason or f"cancelled by {client.issuer}")
            after = _wait_task(client, task, lambda t: t["status"] in TERMINAL, timeout)
            if after is None:
                fail(f"the cancellation of task {task} was sent but not recorded within {timeout:.0f}s", 2)
            if after["status"] != "CANCELLED":
                fail(f"task {task} ended {after['status'].lower()} before the cancellation reached it")
            console.print(f"[yellow]cancelled[/] task {task} ({lit(before['name'])}): {lit(after['reason'])}")
            if before["status"] in ("CLAIMED", "RUNNING"):
                ended = _wait_attempt_end(s, task, before["attempt"], timeout)
                where = f"on worker {lit(before['worker'])}" if before["worker"] else ""
                if ended is None:
                    err.print(f"[yellow]its run {where} has not reported its end yet[/]")
                else:
                    console.print(f"  its run {where} ended: {lit(ended)}")
    except SubmitError as exc:
        fail(str(exc))


@app.command()
def reprioritize(
    task: Annotated[str, typer.Argument(help="a task id")],
    priority: Annotated[int, typer.Argument(help="the new priority (higher runs first among ready tasks)")],
    timeout: Annotated[float, typer.Option(help="seconds to wait for the change to be recorded")] = 30.0,
) -> None:
    """Change the priority of a task not yet claimed (a queued one is taken back and ranked again). Exit
    status: 0 changed, 1 unknown, ended, claimed or running, 2 not recorded in time."""
    from taskstream.sdk import REPRIORITIZABLE, Client, SubmitError

    s = settings()
    try:
        with Client(s, issuer=f"cli:{os.environ.get('USER', 'user')}") as client:
            before = client.task(task)
            client.reprioritize(task, priority)
            after = _wait_task(
                client, task, lambda t: t["priority"] == priority or t["status"] not in REPRIORITIZABLE, timeout
            )
    except SubmitError as exc:
        fail(str(exc))
    if after is None:
        fail(f"the new priority of task {task} was sent but not recorded within {timeout:.0f}s", 2)
    if after["priority"] != priority:
        fail(f"task {task} was claimed ({after['status'].lower()}) before the new priority reached it")
    console.print(f"task {task} ({lit(before['name'])}): priority {before['priority']} -> {priority}")


# ---- schedules ---------------------------------------------------------------------------------------


@schedule_app.command("set")
def schedule_set(
    file: Annotated[Path, typer.Argument(help="a DAG file with a `schedule:` mapping (name, cron, timezone)")],
    timeout: Annotated[float, typer.Option(help="seconds to wait for the decision")] = 60,
) -> None:
    """Set a schedule: the file's DAG is submitted at every time `cron` names (five fields, or six with
    seconds last) in `timezone` (default UTC). Setting the same tenant and name again replaces it. Each
    run is a submission labelled schedule=NAME and scheduled_for=TIME. Exit status: 0 accepted, 1
    rejected, 2 bad file."""
    from taskstream.core.submission import SubmissionError, parse_document
    from taskstream.schemas.records import Schedule

    doc = load_document(file)
    timing = doc.pop("schedule", None) if isinstance(doc, dict) else None
    if (
        not isinstance(timing, dict)
        or not {"name", "cron"} <= set(timing)
        or set(timing) - {"name", "cron", "timezone"}
    ):
        fail(f"{file}: needs a `schedule:` mapping with name and cron (and optionally timezone), got {timing!r}", 2)
    try:
        sub = parse_document(doc, str(file))
    except SubmissionError as exc:
        _bad_file(file, exc)
    sched = Schedule(
        sub.tenant, str(timing["name"]), str(timing["cron"]), str(timing.get("timezone", "UTC")), True,
        sub.labels, sub.tasks,
    )  # fmt: skip
    _send_schedule(sched, timeout)
    console.print(
        f"[green]schedule set[/] {lit(sched.tenant)}/{lit(sched.name)}: {lit(sched.cron)} in {lit(sched.timezone)}"
    )


@schedule_app.command("stop")
def schedule_stop(
    schedule: Annotated[str, typer.Argument(help="TENANT/NAME")],
    timeout: Annotated[float, typer.Option(help="seconds to wait for the decision")] = 60,
) -> None:
    """Stop a schedule: it submits nothing more (what it submitted runs on). Exit status: 0 stopped, 1
    rejected."""
    from taskstream.schemas.records import Schedule

    tenant, _, name = schedule.partition("/")
    # a stopped schedule keeps no times: any valid cron will do for the record's required field
    _send_schedule(Schedule(tenant, name, "* * * * *", "UTC", False), timeout)
    console.print(f"[yellow]schedule stopped[/] {lit(schedule)}")


def _send_schedule(sched: Any, timeout: float) -> None:
    _sid, outcome = _decided(settings(), lambda client: client.set_schedule(sched), timeout)
    if not outcome.accepted:
        _refused(f"schedule {lit(sched.tenant)}/{lit(sched.name)}", outcome.errors, "schedule")


# ---- tenants -----------------------------------------------------------------------------------------


@tenants_app.callback()
def tenants(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every tenant the read model has seen: its tier, cap on tasks queued, claimed or running at once,
    and share weight (what the batcher enforces), its tasks by state now, and when it was last seen."""
    if ctx.invoked_subcommand is not None:
        return
    s = settings()
    with _read_model(s) as conn:
        rows = conn.execute(
            """
            SELECT n.tenant, n.subscription, n.max_running, n.weight, n.set_at IS NOT NULL, n.first_seen,
                   n.last_submission,
                   count(*) FILTER (WHERE t.status IN ('SUBMITTED', 'WAITING', 'READY', 'RETRY_WAIT')),
                   count(*) FILTER (WHERE t.status = 'QUEUED'),
                   count(*) FILTER (WHERE t.status IN ('CLAIMED', 'RUNNING')),
                   count(*) FILTER (WHERE t.status = 'SUCCEEDED'),
                   count(*) FILTER (WHERE t.status IN ('DEAD_LETTERED', 'CANCELLED', 'REJECTED'))
            FROM tenants n LEFT JOIN tasks t ON t.tenant = n.tenant
            GROUP BY n.tenant ORDER BY n.tenant
            """
        ).fetchall()
    keys = ("tenant", "tier", "max_running", "weight", "set", "first_seen", "last_seen", "waiting", "queued",
            "running", "succeeded", "ended_otherwise")  # fmt: skip
    found = [dict(zip(keys, row, strict=True)) for row in rows]
    if as_json:
        print(json.dumps(found, default=str))
        return
    t = Table(title="tenants")
    cols = ("tenant", "tier", "cap", "weight", "waiting", "queued", "running", "succeeded", "other end", "last seen")
    for col in cols:
        t.add_column(col, justify="left" if col in ("tenant", "tier", "last seen") else "right")
    for x in found:
        cap = "-" if x["max_running"] is None else str(x["max_running"])
        tier = lit(x["tier"]) if x["set"] else f"{lit(x['tier'])} (never set)"
        counts = (str(x[k]) for k in ("waiting", "queued", "running", "succeeded", "ended_otherwise"))
        t.add_row(lit(x["tenant"]), tier, cap, f"{x['weight']:g}", *counts, str(x["last_seen"]))
    console.print(t)


@tenants_app.command("set")
def tenants_set(
    tenant: Annotated[str, typer.Argument(help="the tenant's name")],
    tier: Annotated[str, typer.Option(help="free (cap 10, weight 1), standard (no cap, 1) or premium (no cap, 4)")],
    max_running: Annotated[
        int | None, typer.Option(help="most tasks queued, claimed or running at once (default: the tier's)")
    ] = None,
    no_cap: Annotated[bool, typer.Option("--no-cap", help="no cap at all, whatever the tier's")] = False,
    weight: Annotated[
        float | None, typer.Option(help="share of capacity against others' (default: the tier's)")
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the decision")] = 60,
) -> None:
    """Create a tenant or change it. Under TASKSTREAM_TENANTS=closed only tenants set here are admitted.
    Exit status: 0 set, 1 rejected."""

    def send(client: Any) -> tuple[str, str]:
        return client.set_tenant(tenant, tier, max_running=max_running, no_cap=no_cap, weight=weight)  # type: ignore[no-any-return]

    _sid, outcome = _decided(settings(), send, timeout)
    if not outcome.accepted:
        _refused(f"tenant {lit(tenant)}", outcome.errors, "the tenant")
    console.print(f"[green]tenant set[/] {lit(tenant)}: tier {lit(tier)}")


# ---- workers -----------------------------------------------------------------------------------------


@app.command()
def workers(
    within: Annotated[float, typer.Option(min=1, help="seconds of advertisements to read")] = 60,
    as_json: JsonOpt = False,
) -> None:
    """The scheduler workers heard from lately, as each last advertised itself (what the batcher
    counts): slots, claim_ahead, cpus, memory, gpus, the queue lanes it reads, labels, claims held,
    whether it is live (heard within a lease, not stopping), its running tasks (resident memory in all),
    and which resource manager node watches it (the live worker that says so)."""
    from taskstream.connectors.ownership import latest_beats

    s = settings()
    try:
        beats = latest_beats(s, int(within * 1000), "workers", "worker")
    except Exception as exc:  # broker down: say so in one line
        fail(f"cannot read the workers' advertisements from Kafka: {exc}")
    now = time.time() * 1000
    found = []
    for name, b in sorted(beats.items()):
        silent = max(0.0, now - float(b.get("at_ms", 0)))
        found.append({**b, "worker": name, "silent_ms": int(silent),
                      "live": silent < s.lease_ms and not b.get("stopping")})  # fmt: skip
    for w in found:  # by the live nodes' own word (two for a moment while one takes over from another)
        w["watched_by"] = sorted(
            str(n["worker"]) for n in found if n["live"] and w["worker"] in (n.get("watching") or ())
        )
        w["running"] = [x for x in (w.get("running") or []) if isinstance(x, dict)]
    if as_json:
        print(json.dumps(found))
        return
    t = Table(title="workers")
    for col in ("worker", "live", "last heard", "slots", "ahead", "cpus", "memory", "gpus", "lanes", "labels",
                "claims", "running", "watched by"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("worker", "live", "lanes", "labels", "watched by") else "right")
    for w in found:
        live = "[green]yes[/]" if w["live"] else ("[yellow]stopping[/]" if w.get("stopping") else "[red]no[/]")
        labels = ",".join(f"{k}={v}" for k, v in sorted((w.get("labels") or {}).items())) or "-"
        t.add_row(lit(w["worker"]), live, f"{w['silent_ms'] / 1000:.1f}s ago", str(w.get("slots")),
                  str(w.get("claim_ahead")), f"{w.get('cpus', 0):g}", f"{w.get('memory_mb', 0)} MB",
                  str(w.get("gpus")), lit(",".join(w.get("lanes") or [s.lane])), lit(labels),
                  str(w.get("claims")), _running(w["running"]), lit(",".join(w["watched_by"]) or "-"))  # fmt: skip
    console.print(t)
    if not found:
        console.print(f"no worker advertised itself in the last {within:g}s")


def _running(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "0"
    resident = sum(float(x.get("rss_mb") or 0) for x in runs if isinstance(x.get("rss_mb"), int | float))
    return f"{len(runs)} ({resident:.0f} MB)"


# ---- queues ------------------------------------------------------------------------------------------


@app.command()
def queues(
    window: Annotated[float, typer.Option(min=1, help="seconds of history the throughput is taken over")] = 60,
    as_json: JsonOpt = False,
) -> None:
    """Each queue lane, from the read model: tasks waiting in it, the age of the oldest, tasks claimed
    and not finished, and tasks handed out per second over the last WINDOW seconds; and from the
    workers' advertisements, how many live workers read it (the batcher routes a task to a lane all of
    whose live workers fit it, the least loaded of those)."""
    from taskstream.connectors.ownership import latest_beats

    s = settings()
    readers: dict[str, int] | None = {}
    try:
        beats = list(latest_beats(s, s.lease_ms, "workers", "worker").values())
    except Exception:  # the broker is down: the read model's figures are still worth showing
        beats, readers = [], None
    now = time.time() * 1000
    for b in beats:
        if readers is not None and now - float(b.get("at_ms", 0)) < s.lease_ms and not b.get("stopping"):
            for lane in b.get("lanes") or [s.lane]:
                readers[lane] = readers.get(lane, 0) + 1
    with _read_model(s) as conn:
        rows = conn.execute(
            """
            WITH waiting AS (
                SELECT lane, count(*) AS depth, extract(epoch FROM now() - min(queued_at)) AS oldest_s
                FROM tasks WHERE status = 'QUEUED' GROUP BY lane),
            held AS (
                SELECT lane, count(*) AS held FROM tasks WHERE status IN ('CLAIMED', 'RUNNING') GROUP BY lane),
            handed AS (
                SELECT lane, count(*) AS claimed FROM attempts
                WHERE claimed_at > now() - make_interval(secs => %s) GROUP BY lane)
            SELECT lane, coalesce(depth, 0), oldest_s, coalesce(held, 0), coalesce(claimed, 0)
            FROM waiting FULL JOIN held USING (lane) FULL JOIN handed USING (lane)
            WHERE lane IS NOT NULL ORDER BY lane
            """,
            (window,),
        ).fetchall()
    lanes = [
        {"lane": lane, "depth": depth, "oldest_s": None if oldest is None else round(float(oldest), 3),
         "claimed_or_running": held, "claimed_per_s": round(claimed / window, 3)}
        for lane, depth, oldest, held, claimed in rows
    ]  # fmt: skip
    for lane in {s.lane, *(readers or {})} - {q["lane"] for q in lanes}:  # idle lanes too
        lanes.append({"lane": lane, "depth": 0, "oldest_s": None, "claimed_or_running": 0, "claimed_per_s": 0.0})
    lanes.sort(key=lambda q: (q["lane"] != s.lane, q["lane"]))  # the default lane first
    for q in lanes:
        q["workers"] = None if readers is None else readers.get(q["lane"], 0)
    if as_json:
        print(json.dumps(lanes))
        return
    t = Table(title=f"queue lanes (throughput over the last {window:g}s)")
    for col in ("lane", "waiting", "oldest", "claimed or running", "handed out /s", "live workers"):
        t.add_column(col, justify="left" if col == "lane" else "right")
    for q in lanes:
        oldest = "-" if q["oldest_s"] is None else f"{q['oldest_s']:.1f}s"
        readers_of = "?" if q["workers"] is None else str(q["workers"])
        t.add_row(lit(q["lane"]), str(q["depth"]), oldest, str(q["claimed_or_running"]), f"{q['claimed_per_s']:g}",
                  readers_of)  # fmt: skip
    console.print(t)


# ---- dead letters --------------------------------------------------------------------------------------


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[int, typer.Option(min=1, help="show at most this many of each, newest first")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Tasks dead-lettered (retries or leases ran out) and records no agent could decode, newest first,
    from the read model. `taskstream dlq retry TASK` runs such a task again."""
    s = settings()
    with _read_model(s) as conn:
        tasks = conn.execute(
            "SELECT task_id::text, name, tenant, attempt, finished_at, reason FROM tasks "
            "WHERE status = 'DEAD_LETTERED' ORDER BY finished_at DESC NULLS LAST, task_id LIMIT %s",
            (limit,),
        ).fetchall()
        records = conn.execute(
            "SELECT source_topic, source_partition, source_offset, detected_by, reason, logged_at, "
            'octet_length(value) FROM dead_letters ORDER BY logged_at DESC, topic, partition, "offset" LIMIT %s',
            (limit,),
        ).fetchall()
    if as_json:
        task_keys = ("task_id", "name", "tenant", "attempts", "dead_lettered_at", "reason")
        rec_keys = ("topic", "partition", "offset", "detected_by", "reason", "logged_at", "bytes")
        print(json.dumps(
            {"tasks": [dict(zip(task_keys, t, strict=True)) for t in tasks],
             "records": [dict(zip(rec_keys, r, strict=True)) for r in records]},
            default=str,
        ))  # fmt: skip
        return
    t = Table(title=f"dead-lettered tasks ({len(tasks)}{'+' if len(tasks) == limit else ''})")
    for col in ("task", "name", "tenant", "attempts", "when", "why"):
        t.add_column(col)
    for tid, name, tenant, attempts, when, why in tasks:
        t.add_row(tid, lit(name), lit(tenant), str(attempts), str(when or "-"), lit(why))
    console.print(t)
    u = Table(title=f"records nobody could decode ({len(records)}{'+' if len(records) == limit else ''})")
    for col in ("from", "found by", "when", "bytes", "why"):
        u.add_column(col)
    for topic, part, offset, by, why, when, size in records:
        u.add_row(f"{lit(topic)}[{part}]@{offset}", lit(by or "-"), str(when), str(size or 0), lit(why))
    console.print(u)


@dlq_app.command("retry")
def dlq_retry(
    task: Annotated[str, typer.Argument(help="the id of a dead-lettered task")],
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="watch the new task until it ends")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for admission (and, with --follow, the end)")] = 120,
) -> None:
    """Run a dead-lettered task again: a new task of the same tenant and specification, labelled
    retry_of=TASK. The dead-lettered task and its cancelled dependents stay as they ended. Retrying the
    same task twice gives the same new task. Exit status: 0 accepted (and, with --follow, succeeded), 1
    unknown, not dead-lettered or not accepted."""

    s = settings()
    sid, outcome = _decided(s, lambda client: client.retry_dead_lettered(task), min(timeout, 120))
    if not outcome.accepted:
        fail(f"the retry of task {task} was rejected: {'; '.join(lit(p['reason']) for p in outcome.errors)}")
    (new,) = outcome.task_ids.values()
    console.print(f"[green]retrying[/] task {task} as task {new} (submission {sid})")
    if follow:
        raise typer.Exit(0 if follow_submission(s, sid, timeout, tasks=1) else 1)


def _wait_task(client: Any, task: str, done: Any, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = client.task(task)
        if done(row):
            return row  # type: ignore[no-any-return]
        time.sleep(0.2)
    return None


def _wait_attempt_end(s: Settings, task: str, attempt: int, timeout: float) -> str | None:
    """How the attempt ended ("exit -15: killed: cancelled (…)"), once the read model has it."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT exit_code, reason, outcome FROM attempts WHERE task_id = %s AND attempt = %s AND ended_at "
                "IS NOT NULL",
                (task, attempt),
            ).fetchone()
            if row is not None:
                code, why, outcome = row
                return f"{outcome.lower()}, exit {'-' if code is None else code}: {why or ''}".rstrip(": ")
            time.sleep(0.2)
    return None


# ---- graph ---------------------------------------------------------------------------------------------


def _graph() -> Any:
    from taskstream.projections.graph_service import graph_queries

    return graph_queries(settings())


def _graph_call(fn: Any, *args: str) -> Any:
    try:
        return fn(*args)
    except OSError as exc:
        fail(f"cannot reach the graph service (is the stack up?): {exc}")


def _print_ids(ids: list[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(ids))
    else:
        for i in ids:
            print(i)


@graph_app.command("unblocked")
def graph_unblocked(task: str, as_json: JsonOpt = False) -> None:
    """Tasks that depend on TASK and whose every prerequisite has now succeeded."""
    _print_ids(_graph_call(_graph().newly_unblocked, task), as_json)


@graph_app.command("blocks")
def graph_blocks(task: str, as_json: JsonOpt = False) -> None:
    """Everything TASK transitively blocks (its dependents, their dependents, ...)."""
    _print_ids(_graph_call(_graph().blocks, task), as_json)


@graph_app.command("needs")
def graph_needs(task: str, as_json: JsonOpt = False) -> None:
    """Everything TASK transitively needs (its prerequisites, theirs, ...)."""
    _print_ids(_graph_call(_graph().needs, task), as_json)


@graph_app.command("order")
def graph_order(submission: str, as_json: JsonOpt = False) -> None:
    """A topological order of a submission's tasks: prerequisites first."""
    _print_ids(_graph_call(_graph().order, submission), as_json)


@graph_app.command("would-cycle")
def graph_would_cycle(task: str, prerequisite: str, as_json: JsonOpt = False) -> None:
    """Would making TASK depend on PREREQUISITE close a cycle? Exit 1 and print the cycle if so."""
    path = _graph_call(_graph().would_close_cycle, task, prerequisite)
    if as_json:
        print(json.dumps({"cycle": path}))
    elif path:
        console.print("closes a cycle: " + " -> ".join(path))
    else:
        console.print("no cycle")
    raise typer.Exit(1 if path else 0)


# ---- tail ----------------------------------------------------------------------------------------------


@app.command()
def tail(
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="start at offset 0")] = False,
    count: Annotated[int, typer.Option(help="stop after this many events (0: follow forever)")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Follow the events topic, decoded with the registry, the way your own consumers would."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

    from taskstream.connectors.audit import describe
    from taskstream.connectors.kafka import consumer, make_codec
    from taskstream.schemas.codec import DecodeError
    from taskstream.schemas.records import task_events

    s = settings()
    codec = make_codec(s, wait_s=5)
    topic = s.topic("events")
    c = consumer(s, group=f"taskstream-tail-{os.getpid()}")
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    c.assign([TopicPartition(topic, p, start) for p in range(s.partitions)])
    seen = 0
    try:
        while count == 0 or seen < count:
            for m in c.consume(500, 0.5):
                if m.error():
                    continue
                try:  # a packed record (TasksAdmitted, TaskEvents) is shown as the per-task events it stands for
                    rows = [describe(ev, m) for ev in task_events(codec.decode("event", m.value()))]
                except DecodeError as exc:
                    rows = [{"event": "UNDECODABLE", "details": exc.reason, "partition": m.partition(),
                             "offset": m.offset()}]  # fmt: skip
                for row in rows:
                    if as_json:
                        print(json.dumps(row, default=str), flush=True)
                    else:
                        console.print(
                            f"{lit(row.get('log_time', ''))} {lit(row.get('task_id') or row.get('submission_id', ''))}"
                            f" v{lit(row.get('version', '?'))} [bold]{lit(row['event'])}[/] {lit(row['details'])}"
                        )
                    seen += 1
                    if count and seen >= count:
                        break
                if count and seen >= count:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        c.close()


# ---- replay --------------------------------------------------------------------------------------------


@app.command()
def replay(
    verify: Annotated[bool, typer.Option("--verify", help="exit 1, naming the first difference, on mismatch")] = False,
    swap: Annotated[bool, typer.Option("--swap", help="then make the rebuilt projections the live ones")] = False,
) -> None:
    """Rebuild both projections from offset 0 into fresh stores beside the live ones and compare them by
    checksum at the same log positions; optionally swap them in.

    One replay runs at a time (a second waits), and none while a graph swap is still pending."""
    import psycopg

    from taskstream.projections import replay as rp

    s = settings()

    def notice(text: str) -> None:
        err.print(f"[yellow]{escape(text)}[/]")

    try:
        with rp.exclusive(s, notice):
            problems, graph_swap = _replay(s, swap)
        if graph_swap:  # applied by the graph service as it starts again; only then is it live
            rp.wait_for_graph_swap(s, notice)
            where = "the Retired labels" if s.graph_backend == "neo4j" else "a retired-*.lbug file"
            console.print(f"graph: the replayed graph is live; the previous one is kept in {where}")
    except rp.ReplayError as exc:
        fail(str(exc))
    except psycopg.OperationalError as exc:
        fail(f"cannot reach PostgreSQL for the replay lock (is the stack up?): {exc}")
    if problems and verify:
        raise typer.Exit(1)


def _replay(s: Settings, swap: bool) -> tuple[list[str], bool]:
    """Replay, compare, print; with `swap`, swap PostgreSQL in and ask the graph service to swap the
    graph. Returns the differences found and whether a graph swap waits for the graph service."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from taskstream import supervisor as sup
    from taskstream.projections import replay as rp

    try:
        live_pg = rp.live_pg_snapshot(s.dsn)
    except Exception as exc:
        fail(f"cannot read the live PostgreSQL projection (is the stack up?): {exc}")
    try:
        live_graph: rp.Snapshot | None = rp.live_graph_snapshot(s)
    except Exception as exc:
        fail(f"cannot read the live graph ({s.graph_backend}) for its snapshot: {exc}")
    total = sum(sum(v.values()) for v in live_pg.checkpoints.values())
    total += sum(live_graph.checkpoints["graph"].values()) if live_graph else 0
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        bar = progress.add_task("replaying", total=total or None)

        def advance(n: int) -> None:
            progress.advance(bar, n)

        progress.update(bar, description="replaying into PostgreSQL (schema replay)")
        new_pg = rp.replay_pg(s, live_pg.checkpoints, advance)
        new_graph = None
        if live_graph is not None:
            where = "the Replay labels in Neo4j" if s.graph_backend == "neo4j" else "replay.lbug"
            progress.update(bar, description=f"replaying into the graph ({where})")
            new_graph = rp.replay_graph(s, live_graph.checkpoints["graph"], advance)
    t = Table(title="replay against live, at the same offsets")
    for col in ("projection", "rows", "live checksum", "replay checksum", "result"):
        t.add_column(col)
    problems = []
    for name, live, new in (("postgres", live_pg, new_pg), ("graph", live_graph, new_graph)):
        if live is None or new is None:
            continue
        diff = rp.first_difference(live, new)
        t.add_row(
            name,
            str(len(new.rows)),
            live.checksum[:16],
            new.checksum[:16],
            "[green]identical[/]" if diff is None else "[red]DIFFERENT[/]",
        )
        if diff:
            problems.append(f"{name}: first difference: {diff}")
    console.print(t)
    for p in problems:
        err.print(lit(p))
    if not swap:
        return problems, False
    st = sup.read_status(s) or {}
    services = st.get("services", {})
    retired = rp.swap_pg(s)
    _restart(services.get("pg-projector"))
    console.print(f"PostgreSQL: the replayed tables are live; the previous ones are kept in schema {retired}")
    if not services:
        err.print("[yellow]no supervisor found: restart the projector process yourself[/]")
    if new_graph is None:
        return problems, False
    rp.request_graph_swap(s)
    graph = services.get("graph")
    if graph and graph.get("pid") and sup.pid_alive(graph["pid"]):
        _restart(graph)
        return problems, True
    err.print(
        "[yellow]no supervised graph service found: the replayed graph is swapped in when you start the "
        "graph process (`taskstream serve graph`)[/]"
    )
    return problems, False


def _restart(service: dict[str, Any] | None) -> None:
    """Stop a supervised service; the supervisor starts it again (with the swapped-in store)."""
    from taskstream import supervisor as sup

    if service and service.get("pid") and sup.pid_alive(service["pid"]):
        os.kill(service["pid"], signal.SIGTERM)


@app.command()
def bootstrap() -> None:
    """Create topics, register schemas and migrate PostgreSQL on external servers (idempotent).

    `taskstream up` does this itself; use it for docker-compose or your own Kafka/PostgreSQL."""
    from taskstream.connectors.bootstrap import bootstrap as run_bootstrap

    s = settings()
    try:
        run_bootstrap(s)
    except Exception as exc:
        fail(f"bootstrap failed: {exc}")
    console.print(f"topics, schemas and tables ready on {s.bootstrap}, {s.registry}")


# ---- services ------------------------------------------------------------------------------------------


@serve_app.command("supervisor")
def serve_supervisor() -> None:
    from taskstream import serve

    raise typer.Exit(serve.supervisor(settings()))


@serve_app.command("registry")
def serve_registry() -> None:
    from taskstream import serve

    serve.registry(settings())


@serve_app.command("graph")
def serve_graph() -> None:
    from taskstream import serve

    serve.graph(settings())


@serve_app.command("pg-projector")
def serve_pg() -> None:
    from taskstream import serve

    serve.pg_projector(settings())


@serve_app.command("admission")
def serve_admission(index: Annotated[int, typer.Option()] = 0) -> None:
    from taskstream import serve

    serve.admission(settings(), index)


@serve_app.command("worker")
def serve_worker(index: Annotated[int, typer.Option()] = 0) -> None:
    _run_worker(settings(), index)


@app.command()
def worker(
    index: Annotated[
        int | None,
        typer.Option(min=0, help="which worker of the state directory (default: the first the stack's own do not use)"),
    ] = None,
    slots: Annotated[
        int | None, typer.Option(min=1, help="tasks it runs at once (default: TASKSTREAM_WORKER_SLOTS)")
    ] = None,
    cpus: Annotated[
        float | None, typer.Option(min=0.001, help="cpus it offers to tasks (default: one per slot)")
    ] = None,
    memory: Annotated[
        str | None, typer.Option(help="memory it offers, e.g. 512MiB, 8GiB, 2000 (MiB) (default: the machine's)")
    ] = None,
    gpus: Annotated[int | None, typer.Option(min=0, help="gpus it offers (default: 0)")] = None,
    label: Annotated[list[str] | None, typer.Option(help="k=v, advertised with the rest (repeatable)")] = None,
    lane: Annotated[
        list[str] | None,
        typer.Option(
            help="a queue lane it reads besides the default one (repeatable; default: TASKSTREAM_WORKER_LANES)"
        ),
    ] = None,
) -> None:
    """Run one more worker in the foreground, against the stack the TASKSTREAM_* settings name (the
    embedded one by default). It joins the workers' group, takes a share of the tasks' partitions (as
    their owner) and of the queue (and of each --lane's: the batcher routes a task to a lane all of whose
    live workers fit it), and runs tasks, programs and callables, in its slots. SIGTERM or
    Ctrl-C drains it: it claims nothing more, lets its running tasks finish for up to
    TASKSTREAM_DRAIN_MS and hands back the rest, which run again elsewhere. If it dies, its task
    processes die with it and its leases expire. Exit status 2: bad settings, or the index is taken."""
    from dataclasses import replace

    from taskstream.settings import lanes_of, worker_labels

    s = settings()
    if slots is not None:
        s = replace(s, worker_slots=slots)
    if cpus is not None:
        s = replace(s, worker_cpus=cpus)
    if memory is not None:
        try:
            s = replace(s, worker_memory_mb=memory_mb(memory))
        except ValueError as exc:
            fail(f"--memory {memory!r}: {exc}", 2)
    if gpus is not None:
        s = replace(s, worker_gpus=gpus)
    if label:
        try:
            worker_labels(",".join(label))
        except ValueError as exc:
            fail(f"--label: {exc}", 2)
        s = replace(s, worker_labels=",".join(label))
    if lane:
        s = replace(s, worker_lanes=",".join(lane))
    try:
        lanes = lanes_of(s)
    except ValueError as exc:
        fail(f"--lane: {exc}", 2)
    chosen = s.workers if index is None else index  # the supervisor's own workers are 0 .. workers-1
    offers = (f"{s.worker_slots} slots, {s.worker_cpus or s.worker_slots:g} cpus, {s.worker_gpus} gpus, "
              f"lanes {', '.join(lanes)}")  # fmt: skip
    _run_worker(s, chosen, f"worker {chosen} ({offers}) joining {s.bootstrap}; its log follows")


_SIZE_UNITS = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024, "t": 1024**2, "tb": 1024**2,
               "tib": 1024**2}  # fmt: skip


def memory_mb(text: str) -> int:
    """A size as MiB: a number with an optional unit (MiB, GiB, TiB; M, G, T and MB, GB, TB read as those)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError("expected a size such as 512MiB, 8GiB or 2000 (MiB)")
    mb = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if mb < 1:
        raise ValueError("must be at least 1 MiB")
    return mb


def _run_worker(s: Settings, index: int, hello: str = "") -> None:
    from taskstream import serve
    from taskstream.streams.app import WorkerIndexTaken, hold_index

    try:
        hold_index(s, index).close()  # refused here, before Faust starts, if another holds it
    except WorkerIndexTaken as exc:
        fail(str(exc), 2)
    if hello:
        err.print(lit(hello))
    sys.argv = [sys.argv[0], "worker"]  # Faust's Worker reads argv
    try:
        serve.worker(s, index)
    except WorkerIndexTaken as exc:  # taken in between
        fail(str(exc), 2)


def main() -> None:
    app()
