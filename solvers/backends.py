"""MILP backends behind one call: HiGHS (highspy, default), CBC (PuLP's bundled binary), Gurobi (gurobipy,
when licensed). Each reports status, incumbent, best bound and gap, streams progress, takes a warm start."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pulp

BACKENDS = ("highs", "cbc", "gurobi")


class SolverUnavailable(RuntimeError):
    """The requested backend cannot run here (not installed, unlicensed or licence too small)."""


@dataclass
class Progress:
    """One progress sample: seconds since start, incumbent and best bound (model units), nodes."""

    time_s: float
    incumbent: float
    bound: float
    nodes: int = 0

    @property
    def gap(self) -> float:
        return relative_gap(self.incumbent, self.bound)


@dataclass
class SolveOutcome:
    """``status``: optimal | time_limit | interrupted | infeasible | no_solution. Objective values are in
    model units including the objective's constant; ``has_solution`` says the variables hold an incumbent."""

    backend: str
    status: str
    has_solution: bool
    incumbent: float
    bound: float
    wall_s: float
    progress: list[Progress] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    nodes: int | None = None  # branch-and-bound nodes and simplex iterations, where the backend reports them
    lp_iterations: int | None = None

    @property
    def gap(self) -> float:
        return relative_gap(self.incumbent, self.bound)


class SolverFailed(RuntimeError):
    """The backend crashed or contradicted a verified feasible warm start."""


def relative_gap(incumbent: float, bound: float) -> float:
    """``(incumbent − bound) / |incumbent|`` (0 when equal, inf without an incumbent)."""
    if not math.isfinite(incumbent):
        return math.inf
    if incumbent == bound:
        return 0.0
    return max(0.0, incumbent - bound) / max(abs(incumbent), 1e-12)


@dataclass
class SolveOptions:
    backend: str = "highs"
    time_limit_s: float | None = None
    mip_gap: float = 1e-6
    threads: int | None = None
    verbose: bool = False
    on_progress: Callable[[Progress], None] | None = None
    stop_if_incumbent_below: float | None = None  # model units: stop once an incumbent reaches it
    stop_if_bound_above: float | None = None  # model units: stop once the bound proves it unreachable
    stop_after_s: float | None = None  # wall seconds after which the solver's process is stopped (`solve`)
    # each improving incumbent's values, in ``prob.variables()`` order (HiGHS only; `_solve_in_child` keeps the last)
    on_incumbent: Callable[[list[float]], None] | None = None


def solve(prob: pulp.LpProblem, options: SolveOptions, warm: bool = False) -> SolveOutcome:
    """Solve ``prob`` in place (variables hold the incumbent). ``warm``: use the variables' current values
    as a MIP start.

    With a time limit, HiGHS and CBC run in a forked process that is stopped once ``options.stop_after_s`` have
    passed (default: the time limit plus `stop_grace_s`), because neither always honours its own limit: HiGHS
    1.16 spent 22 minutes past a 300 s limit in its root node's mod-k cut separation, which does not look at the
    clock (`benchmarks/solver_scaling.py`, B = 32), and CBC returned after 468 s. A stopped solve keeps the best
    bound it reported and the better of the warm start and HiGHS's last incumbent (`_solve_in_child`). Gurobi,
    which keeps its limits, solves in this process, as does every backend where a fork is not possible or not safe
    (`_can_fork`)."""
    if options.backend not in BACKENDS:
        raise ValueError(f"unknown solver {options.backend!r}; choose one of {', '.join(BACKENDS)}")
    run = {"highs": _solve_highs, "cbc": _solve_cbc, "gurobi": _solve_gurobi}[options.backend]
    if options.time_limit_s is not None and options.backend != "gurobi" and _can_fork():
        return _solve_in_child(run, prob, options, warm)
    with quiet_stdout(not options.verbose):
        return run(prob, options, warm)


def _can_fork() -> bool:
    """Whether the solver may run in a forked process: ``fork`` exists and is safe here (not on macOS, where
    Python calls it unsafe), and this process may start one (a daemonic process, a ``Pool``'s worker, may not)."""
    return ("fork" in mp.get_all_start_methods() and sys.platform != "darwin"
            and not mp.current_process().daemon)


def stop_grace_s(time_limit_s: float) -> float:
    """How long a solver may run past its own time limit before its process is stopped: 5 s, or 5% of a long
    limit (a solver that stops at its limit returns within a second or two: the values are read back)."""
    return max(5.0, 0.05 * time_limit_s)


def _solve_in_child(run, prob: pulp.LpProblem, options: SolveOptions, warm: bool) -> SolveOutcome:
    """``run(prob, options, warm)`` in a forked process (it inherits the model and the warm start as they are),
    stopped with its whole process group (CBC runs as a grandchild) once ``stop_after_s`` have passed. Progress
    samples come back as they are made and reach ``options.on_progress`` here; the variables' values come back
    with the outcome, and HiGHS's improving incumbents as it finds them. A stopped solve returns status
    ``time_limit`` with the best bound among the samples received and, as its incumbent, the better of the warm
    start (the variables here still hold it) and the last incumbent HiGHS sent (CBC sends none: it reports its
    solutions only when it returns), and says so in ``notes``. The backend's own errors are raised again here; a
    process that ends without an answer (killed for memory, say) raises `SolverFailed`."""
    variables = prob.variables()
    stop_after_s = options.stop_after_s
    if stop_after_s is None:
        stop_after_s = options.time_limit_s + stop_grace_s(options.time_limit_s)
    scratch = tempfile.mkdtemp(prefix="infermax-solver-")  # its temporary files (CBC's model and solution files)
    started = time.perf_counter()
    try:
        with forked(lambda send: _child_solve(run, prob, variables, options, warm, send, scratch)) as (child, receive):
            return _follow(child, receive, prob, variables, options, warm, started, stop_after_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def forked(target: Callable):
    """A forked process running ``target(send)``, ``send`` the sending end of a pipe; yields (the process, the
    receiving end). On leaving, the process is stopped with its whole group where it made one (CBC runs as a
    grandchild), else alone, and waited for. HiGHS's worker threads are shut down first (`_stop_highs_threads`)."""
    _stop_highs_threads()
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=(send,), daemon=True)
    child.start()
    send.close()
    try:
        yield child, receive
    finally:
        receive.close()
        if child.is_alive():
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:  # not in a group of its own (yet)
                child.kill()
        child.join()


def _follow(child, receive, prob: pulp.LpProblem, variables: list, options: SolveOptions, warm: bool, started: float,
            stop_after_s: float) -> SolveOutcome:
    """`_solve_in_child`'s side of the pipe: progress and incumbents as they come, until the outcome, an error, the
    child's end or the stop."""
    trace: list[Progress] = []
    found: list[float] | None = None  # the last incumbent the solver sent
    while True:
        left = stop_after_s - (time.perf_counter() - started)
        if not receive.poll(max(left, 0.0)):  # (what arrived before the stop is still read)
            return _stopped(prob, variables, options, warm, found, trace, time.perf_counter() - started)
        try:
            message = receive.recv()
        except EOFError:
            child.join(1.0)
            raise SolverFailed(f"the {options.backend} process ended without an answer (exit code "
                               f"{child.exitcode}; a negative code is the signal that stopped it, e.g. -9 when "
                               f"the system ran out of memory)") from None
        kind, payload = message
        if kind == "progress":
            trace.append(payload)
            if options.on_progress:
                options.on_progress(payload)
        elif kind == "incumbent":
            found = payload
        elif kind == "done":
            outcome, values = payload
            for v, value in zip(variables, values):
                v.varValue = value
            return outcome
        else:
            raise payload


def _stopped(prob: pulp.LpProblem, variables: list, options: SolveOptions, warm: bool, found: list[float] | None,
             trace: list[Progress], wall_s: float) -> SolveOutcome:
    """The outcome of a solve whose process was stopped: the best bound among its progress samples and as its
    incumbent the better (in the model's sense) of the warm start, which the variables here still hold, and the
    solver's last incumbent ``found``, which they are set to when it wins."""
    bound = max((p.bound for p in trace), default=-math.inf)
    start = prob.objective.value() if warm else None  # (None: the start leaves an objective variable unset)
    value, kept = start, "the warm start as its incumbent"
    if found is not None:
        column = {v.name: i for i, v in enumerate(variables)}
        solver_value = _constant(prob)
        for v, c in prob.objective.items():  # as `LpAffineExpression.value` sums, without setting the variables
            solver_value += found[column[v.name]] * c
        if start is None or prob.sense * (solver_value - start) < 0:
            value, kept = solver_value, "its last incumbent"
            for v, x in zip(variables, found):
                v.varValue = x
    has = value is not None
    kept = "the best bound it reported" + (f" and {kept}" if has else "")
    note = (f"{options.backend} had not returned {wall_s:.0f} s after it started (time limit "
            f"{options.time_limit_s:.0f} s); its process was stopped, keeping {kept}")
    return SolveOutcome(options.backend, "time_limit", has, value if has else math.inf, bound, wall_s, trace,
                        notes=[note])


def _stop_highs_threads() -> None:
    """Shut down HiGHS's worker threads (its bound LPs started them) before a fork: the forked process inherits
    the pool's state but not its threads, and its first HiGHS solve then waits for them forever (seen on the
    second solve of `tests/test_solver_process.py`). HiGHS starts a new pool on its next solve."""
    if "highspy" in sys.modules:
        sys.modules["highspy"].Highs.resetGlobalScheduler(True)


def _child_solve(run, prob, variables, options: SolveOptions, warm: bool, send, scratch: str) -> None:
    """The forked solver process of `_solve_in_child`: its own process group, its temporary files in
    ``scratch`` (removed by the parent, also when it stops this process), progress and the result sent back
    through ``send``; an error is sent as one of ours (its type kept for `SolverUnavailable`, `SolverFailed` and
    ``ValueError``, which callers tell apart)."""
    os.setpgid(0, 0)
    os.environ["TMPDIR"] = os.environ["TMP"] = os.environ["TEMP"] = tempfile.tempdir = scratch
    lock = threading.Lock()  # (CBC's progress comes from a thread that follows its log)

    def report(sample: Progress) -> None:
        with lock:
            send.send(("progress", sample))

    def incumbent(values: list[float]) -> None:
        with lock:
            send.send(("incumbent", values))

    try:
        with quiet_stdout(not options.verbose):
            outcome = run(prob, replace(options, on_progress=report, on_incumbent=incumbent), warm)
        send.send(("done", (outcome, [v.varValue for v in variables])))
    except BaseException as exc:  # noqa: BLE001  (anything the backend raises goes back to the caller)
        if not isinstance(exc, (SolverUnavailable, SolverFailed, ValueError)):
            exc = SolverFailed(f"{options.backend} failed: {type(exc).__name__}: {exc}")
        send.send(("error", exc))
    finally:
        send.close()


@contextmanager
def quiet_stdout(active: bool = True):
    """Silence what native solver code writes to file descriptor 1 (HiGHS prints its copyright banner there
    when the first model is created), so ``--json`` output is JSON alone; Python's own stdout is flushed
    first and restored after. Progress goes to stderr and is unaffected."""
    if not active:
        yield
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no usable descriptor 1 (embedded interpreters): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _constant(prob) -> float:
    return float(prob.objective.constant) if prob.objective is not None else 0.0


# ------------------------------------------------------------------------------------------------ HiGHS
class _HiGHS(pulp.HiGHS):
    """PuLP's highspy interface plus a MIP start, progress/stop callbacks and the best bound."""

    def __init__(self, options: SolveOptions, warm: bool, **kw):
        super().__init__(msg=options.verbose, gapRel=options.mip_gap, threads=options.threads,
                         timeLimit=options.time_limit_s, **kw)
        # HiGHS's default tolerances: with mip_feasibility_tolerance=1e-9, HiGHS 1.15 reported a
        # suboptimal "optimal" on a brute-forced instance (tests/test_solver_bruteforce.py)
        self.opts, self.warm, self.trace, self.info = options, warm, [], None

    def actualSolve(self, lp):
        import highspy

        self.createAndConfigureSolver(lp)
        self.buildSolverModel(lp)
        h = lp.solverModel
        offset = _constant(lp)
        if self.warm:
            sol = highspy.HighsSolution()
            sol.col_value = [v.varValue if v.varValue is not None else 0.0 for v in lp.variables()]
            sol.value_valid = True
            h.setSolution(sol)
        opts, last = self.opts, [0.0]

        def on_interrupt(event):
            out = event.data_out
            inc, bnd = out.mip_primal_bound + offset, out.mip_dual_bound + offset
            now = out.running_time
            if now - last[0] >= 1.0:
                last[0] = now
                sample = Progress(now, inc, bnd, int(out.mip_node_count))
                self.trace.append(sample)
                if opts.on_progress:
                    opts.on_progress(sample)
            if (opts.stop_if_incumbent_below is not None and inc <= opts.stop_if_incumbent_below) or \
                    (opts.stop_if_bound_above is not None and bnd > opts.stop_if_bound_above):
                event.interrupt()

        if h.getNumCol() and any(v.cat == pulp.LpInteger for v in lp.variables()):
            h.cbMipInterrupt.subscribe(on_interrupt)
            if opts.on_incumbent:  # columns are in lp.variables() order (PuLP's buildSolverModel)
                h.cbMipImprovingSolution.subscribe(
                    lambda event: opts.on_incumbent(event.data_out.mip_solution.tolist()))
        self.callSolver(lp)
        status, sol_status = self.findSolutionValues(lp)
        lp.assignStatus(status, sol_status)
        self.info = h.getInfo()
        self.model_status = h.getModelStatus()
        return status


def _solve_highs(prob, options, warm) -> SolveOutcome:
    import highspy

    solver = _HiGHS(options, warm)
    t0 = time.perf_counter()
    prob.solve(solver)
    wall = time.perf_counter() - t0
    info, ms = solver.info, solver.model_status
    offset = _constant(prob)
    has = info.primal_solution_status == 2
    inc = info.objective_function_value + offset if has else math.inf
    if ms == highspy.HighsModelStatus.kInfeasible:
        bound = math.inf  # no feasible point: every objective value is ruled out (as CBC's branch reports)
    elif ms == highspy.HighsModelStatus.kOptimal and not math.isfinite(info.mip_dual_bound):
        bound = inc  # solved without branching (an LP, or presolve closed it)
    else:
        bound = info.mip_dual_bound + offset if math.isfinite(info.mip_dual_bound) else -math.inf
    status = {highspy.HighsModelStatus.kOptimal: "optimal", highspy.HighsModelStatus.kTimeLimit: "time_limit",
              highspy.HighsModelStatus.kInterrupt: "interrupted", highspy.HighsModelStatus.kInfeasible: "infeasible"
              }.get(ms, "no_solution" if not has else "time_limit")
    return SolveOutcome("highs", status, has, inc, bound, wall, solver.trace, nodes=int(info.mip_node_count),
                        lp_iterations=int(info.simplex_iteration_count))


# ------------------------------------------------------------------------------------------------ CBC
_CBC_PROGRESS = re.compile(r"After (\d+) nodes, \d+ on tree, ([-\d.e+]+) best solution, best possible ([-\d.e+]+) \(([\d.]+) seconds\)")


def cbc_command(**kwargs) -> "pulp.PULP_CBC_CMD":
    """PuLP's bundled CBC (`PULP_CBC_CMD`). PuLP 3.3 deprecates it for `COIN_CMD` with CBC from the ``cbcbox``
    package, 598 MB installed (measured 2026-11-29), against the few MB of the binary PuLP bundles; so the bundled
    one stays, PuLP is held below 4.0 (which removes it: pyproject.toml), and its deprecation warning, which asks
    every user for that install, is not shown (docs/design.md, Backends)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PULP_CBC_CMD is deprecated", category=DeprecationWarning)
        return pulp.PULP_CBC_CMD(**kwargs)


def _solve_cbc(prob, options, warm) -> SolveOutcome:
    """CBC; when its preprocessing declares the model infeasible (or CBC fails) although the caller's warm
    start satisfies every constraint, retry once with preprocessing off for the remaining time (seen at
    B = 16 in benchmarks/solver_scaling.py)."""
    if not cbc_command().available():
        raise SolverUnavailable("CBC is not available (PuLP's bundled cbc binary is missing)")
    t0 = time.perf_counter()
    start = [(v, v.varValue) for v in prob.variables()] if warm else []
    try:
        out = _run_cbc(prob, options, warm, options.time_limit_s, [])
    except pulp.PulpSolverError as exc:
        out = SolveOutcome("cbc", "solver_error", False, math.inf, -math.inf, time.perf_counter() - t0,
                           notes=[f"CBC failed: {exc}"])
    if warm and out.status in ("infeasible", "solver_error"):
        left = None if options.time_limit_s is None else max(1.0, options.time_limit_s - out.wall_s)
        note = f"CBC with preprocessing said {out.status} despite a feasible warm start; retried with preprocessing off"
        for v, value in start:
            v.varValue = value
        try:
            out = _run_cbc(prob, options, warm, left, ["preprocess off"])
        except pulp.PulpSolverError as exc:
            raise SolverFailed(f"CBC failed twice: {exc}") from exc
        out.notes.insert(0, note)
        out.wall_s = time.perf_counter() - t0
    if warm and out.status == "infeasible":
        raise SolverFailed("CBC declared the model infeasible although the warm start satisfies every constraint")
    return out


def _run_cbc(prob, options, warm, time_limit, extra) -> SolveOutcome:
    offset = _constant(prob)
    trace: list[Progress] = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cbc.log"
        solver = cbc_command(msg=False, timeLimit=time_limit, gapRel=options.mip_gap, threads=options.threads,
                             warmStart=warm, logPath=str(log), keepFiles=False, options=extra)
        if warm:
            for v in prob.variables():
                if v.varValue is not None:
                    v.setInitialValue(v.varValue)
        done = threading.Event()

        def tail():  # CBC reports progress only in its log: follow it
            seen = 0
            while not done.wait(1.0):
                text = log.read_text() if log.exists() else ""
                for mt in _CBC_PROGRESS.finditer(text, seen):
                    seen = mt.end()
                    sample = Progress(float(mt.group(4)), float(mt.group(2)) + offset, float(mt.group(3)) + offset,
                                      int(mt.group(1)))
                    trace.append(sample)
                    if options.on_progress:
                        options.on_progress(sample)

        thread = threading.Thread(target=tail, daemon=True)
        thread.start()
        t0 = time.perf_counter()
        try:
            prob.solve(solver)
        finally:
            done.set()
            thread.join()
        wall = time.perf_counter() - t0
        text = log.read_text() if log.exists() else ""
    result = re.search(r"Result - (.*)", text)
    result = result.group(1) if result else ""
    objective = re.search(r"Objective value:\s+([-\d.e+]+)", text)
    lower = re.search(r"Lower bound:\s+([-\d.e+]+)", text)
    has = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) and objective is not None
    inc = float(objective.group(1)) + offset if has else math.inf
    if "Optimal" in result:
        status, bound = "optimal", inc
    elif "infeasible" in result.lower() or ("infeasible" in text.lower() and not has):
        status, bound = "infeasible", math.inf
    else:
        status = "time_limit" if has else "no_solution"
        bound = float(lower.group(1)) + offset if lower else -math.inf
    return SolveOutcome("cbc", status, has, inc, bound, wall, trace)


# ------------------------------------------------------------------------------------------------ Gurobi
SIZE_LIMITED = 10010  # GRB_ERROR_SIZE_LIMIT_EXCEEDED: the pip wheel's restricted licence


def gurobi_error_message(exc: Exception, prob: pulp.LpProblem) -> str | None:
    """A user-facing explanation when ``exc`` is Gurobi's size-limited-licence error, else None."""
    if getattr(exc, "errno", None) == SIZE_LIMITED or "size-limited" in str(exc).lower():
        return (f"Gurobi's licence here is size-limited (the pip package's restricted licence, 2000 variables and "
                f"2000 constraints); this model has {len(prob.variables())} variables and {len(prob._constraints)} "
                f"constraints. Use --solver highs or --solver cbc, fewer slots, or install a full Gurobi licence.")
    return None


def _solve_gurobi(prob, options, warm) -> SolveOutcome:
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        raise SolverUnavailable("Gurobi is not installed (pip install gurobipy; it needs a licence for models "
                                "above 2000 variables/constraints)") from None
    solver = pulp.GUROBI(msg=options.verbose, timeLimit=options.time_limit_s, gapRel=options.mip_gap,
                         warmStart=warm, **({"Threads": options.threads} if options.threads else {}))
    if warm:
        for v in prob.variables():
            if v.varValue is not None:
                v.setInitialValue(v.varValue)
    t0 = time.perf_counter()
    try:
        prob.solve(solver)
    except Exception as exc:  # gurobipy.GurobiError (licence, size limit) or PuLP's wrapper of it
        message = gurobi_error_message(exc, prob) or f"Gurobi failed: {exc}"
        raise SolverUnavailable(message) from exc
    wall = time.perf_counter() - t0
    model = prob.solverModel
    offset = _constant(prob)
    has = model.SolCount > 0
    inc = model.ObjVal + offset if has else math.inf
    status = {2: "optimal", 9: "time_limit", 11: "interrupted", 3: "infeasible"}.get(model.Status, "no_solution")
    bound = model.ObjBound + offset if model.IsMIP else inc
    return SolveOutcome("gurobi", status, has, inc, bound, wall, [])
