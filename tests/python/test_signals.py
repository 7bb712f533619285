"""Ctrl-C during long calls: the call ends (within its budget) and
KeyboardInterrupt is raised at the next safe point; nothing hangs, and the
interpreter exits normally afterwards."""

import os
import signal
import subprocess
import sys
import time

PROG = r"""
import faulthandler, signal, sys, time, torch, dataplane
# Ctrl-C as an interactive interpreter has it: a run started in the background
# by a shell without job control inherits SIGINT ignored, and Python then
# keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang
c = dataplane.Client(sys.argv[1], timeout_s=20)
rows = list(range(900000, 900064))
x = torch.randn(64, 262144)
c.put(rows, {"x": x})
print("ready", flush=True)
n = 0
try:
    while True:
        got = c.get(rows, ["x"])["x"]
        assert all(torch.equal(g, x[i]) for i, g in enumerate(got))
        c.put(rows, {"x": x})
        n += 1
except KeyboardInterrupt:
    c.clear(rows)  # the client still works after the interrupt
    c.close()
    print(f"interrupted after {n} rounds", flush=True)
    sys.exit(0)
"""


def test_ctrl_c_during_transfers(cluster):
    p = subprocess.Popen([sys.executable, "-c", PROG, str(cluster)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            # Where it hangs: every Python thread's stack (faulthandler), and
            # what each native thread waits in.
            native = []
            for t in sorted(os.listdir(f"/proc/{p.pid}/task")):
                try:
                    with open(f"/proc/{p.pid}/task/{t}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{p.pid}/task/{t}/wchan") as f:
                        wchan = f.read().strip()
                    with open(f"/proc/{p.pid}/task/{t}/syscall") as f:
                        sc = f.read().strip()
                    native.append(f"{t} {comm}: wchan {wchan}, syscall {sc}")
                except OSError:
                    pass
            p.send_signal(signal.SIGUSR1)
            time.sleep(2)
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"no exit 30 s after SIGINT; stdout: {out!r}\n"
                                 f"stderr: {err}\nthreads:\n" + "\n".join(native))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "interrupted after" in out
