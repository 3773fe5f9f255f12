"""Run many `capacity` invocations in one process, each bounded by a time limit, and report how each ended.

    python tests/adversarial_runner.py attacks.json results.json

attacks.json: [{"id", "argv", "env", "cwd", "timeout_s"}]. For each attack the real entry point
(`capacity.cli.main`) runs with that argv; stdout/stderr are captured, SystemExit gives the exit code, an alarm
stops an attack that runs past its time (reported as "hang"), and the process's peak memory after each attack
is recorded. The parent test sets an address-space limit on this process, so runaway memory ends the batch
with the attack that caused it named in results.json (written after every attack).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys
import time
import traceback


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang


def main(attacks_path: str, out_path: str) -> None:
    from capacity.cli import main as capacity_main

    attacks = json.load(open(attacks_path))
    results: dict[str, dict] = {}
    signal.signal(signal.SIGALRM, _alarm)
    base_env = dict(os.environ)
    home = os.getcwd()
    for a in attacks:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(a.get("env") or {})
        os.chdir(a.get("cwd") or home)
        out, err = io.StringIO(), io.StringIO()
        sys.argv = ["capacity", *a["argv"]]
        code, kind = 0, "exit"
        t0 = time.perf_counter()
        signal.alarm(int(a.get("timeout_s", 60)))
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                capacity_main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except _Hang:
            kind = "hang"
        except BaseException:  # escaped the boundary: a traceback a user would see
            kind = "traceback"
            err.write(traceback.format_exc())
        finally:
            signal.alarm(0)
        results[a["id"]] = {
            "code": code, "kind": kind, "stderr": err.getvalue()[-4000:], "stdout": out.getvalue()[-4000:],
            "seconds": time.perf_counter() - t0,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        with open(out_path, "w") as f:
            json.dump(results, f)
    os.chdir(home)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
