"""How a marked test ended on this launched rank, as the report it publishes for rank 0: from the
body (classified as a forked rank classifies it), or from a set-up that failed or skipped."""

from __future__ import annotations

from ..core.reports import RankReport
from ..core.states import Phase, RankState
from ..rank.stacks import describe_exception, exit_like_os_exit, format_exception


def format_body_exception(exc: BaseException) -> str:
    """From the test body on: not pytest's, pluggy's or our frames around it."""
    return format_exception(exc, cut_to_user=True)


def body_outcome(item, config, user_code, rank: int) -> tuple[RankReport, BaseException | None]:
    """Run the test function here, inside ``user_code`` (a context manager: where the bound may
    interrupt it); (this rank's report, the exception it raised, an interrupt included)."""
    kwargs = {arg: item.funcargs[arg] for arg in item._fixtureinfo.argnames}
    status, exc_type, exc_text, message = RankState.PASSED, "", "", ""
    error = None
    try:
        with user_code:
            item.obj(**kwargs)
    except SystemExit as exc:
        exit_like_os_exit(exc)  # as in plugin mode
    except BaseException as exc:
        error = exc
        status, exc_type, exc_text, message = describe_exception(exc, format_body_exception)
    report = RankReport(rank, status, exc_type=exc_type, exc_text=exc_text, message=message,
                        output=captured_output(config))
    return report, error


def captured_output(config) -> str:
    """What the body printed on this rank (pytest's capture, taken so that rank 0 shows it)."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        return ""
    try:
        if not capman.is_globally_capturing():
            return ""
        out, err = capman.read_global_capture()
        return (out or "") + (err or "")
    except Exception:  # pytest's capture manager, any version: no output then
        return ""


def setup_outcome(item, rep, rank: int, call=None) -> RankReport:
    """The report of a rank whose set-up failed or skipped (or whose body was never called)."""
    status, exc_type, exc_text, message = RankState.FAILED, "", "", ""
    if rep.skipped:
        if hasattr(rep, "wasxfail"):
            status, message = RankState.XFAILED, str(rep.wasxfail)
        else:
            status = RankState.SKIPPED
            message = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr or "")
            message = message.removeprefix("Skipped: ")
    else:
        exc = call.excinfo.value if call is not None and call.excinfo is not None else None
        where = " (in the test's setup)" if Phase(rep.when) is Phase.SETUP else ""
        if exc is not None:
            exc_type = type(exc).__name__
            text = (str(getattr(exc, "msg", "")) or str(exc)).strip().split("\n")[0][:300]
            message = f"{exc_type}: {text}{where}" if text else f"{exc_type}{where}"
            exc_text = format_body_exception(exc)
        else:
            message = f"failed{where}"
    output = "".join(content for when, _, content in getattr(item, "_report_sections", []) if when == rep.when)
    return RankReport(rank, status, exc_type=exc_type, exc_text=exc_text, message=message, output=output)
