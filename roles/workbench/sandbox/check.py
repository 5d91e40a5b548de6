"""One check command in a sandbox: the one function every check the org runs goes through — the
eval-agent's verdicts (``roles/eval_agent/checks.run_check``), the discovery scan
(``roles/operations/discover``) and the coordinator's verify-fails triggers (through
``roles/operations/watch``). Each caller builds its runner (``runner_from_config``) on a snapshot
it owns; what the output means is the caller's to judge.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

from roles.workbench.sandbox.capture import Captured


def run_check_command(runner, command: str, cwd: Path, *, timeout_s: float, max_output: int,
                      env: Mapping[str, str] | None = None, should_stop: Callable[[], bool] | None = None,
                      binds: Sequence[tuple[Path, Path]] = ()) -> Captured:
    """Run ``command`` (a shell line) in ``cwd`` with ``runner``, bounded by ``timeout_s`` and
    ``max_output`` bytes; ``env`` adds to the runner's clean environment, ``should_stop`` (polled
    every half second) stops a check nobody waits for any more, ``binds`` (host, inside) show
    files such as a test report's folder.

    A runner with only the older ``run(command, cwd, timeout_s, max_output)`` (a test double) is
    called that way, without ``env``, ``should_stop`` or ``binds``.

    Raises:
        SandboxError (an ``OrgError``): the sandbox refused or failed; the check did not run.

    Returns:
        the captured run: ``exit_code``, ``output``, ``timed_out``, ``truncated``, ``stopped``.
    """
    if hasattr(runner, "execute"):
        return runner.execute(command, cwd=cwd, timeout_s=timeout_s, max_output=max_output, env=env,
                              should_stop=should_stop, poll_s=0.5, binds=binds)
    return runner.run(command, cwd, timeout_s, max_output)
