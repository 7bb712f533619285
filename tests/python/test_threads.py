"""One Client shared by threads, and the GIL released while bytes move."""

import sys
import threading
import time

import torch

def _row_value(row, it, n=256):
    return torch.full((n,), float(row * 1000 + it))


def test_threads_share_a_client(client, fresh_rows):
    n_writers, n_iter, per = 4, 15, 8
    wrows = [fresh_rows(per) for _ in range(n_writers)]
    grows = fresh_rows(16)
    gvals = torch.arange(16 * 64, dtype=torch.int32).view(16, 64)
    client.put(grows, {"g": gvals})
    errors, done = [], threading.Event()
    gets = [0]

    def writer(rows):
        try:
            for it in range(n_iter):
                batch = torch.stack([_row_value(r, it) for r in rows])
                client.put(rows, {"w": batch, "tag": [f"{r}:{it}".encode() for r in rows]})
                got = client.get(rows, ["w", "tag"])
                for i, r in enumerate(rows):
                    assert torch.equal(got["w"][i], batch[i]), (r, it)
                    assert got["tag"][i] == f"{r}:{it}".encode()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def getter():
        try:
            while not done.is_set():
                got = client.get(grows, ["g"])["g"]
                for i, g in enumerate(got):
                    assert torch.equal(g, gvals[i])
                gets[0] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=writer, args=(r,)) for r in wrows]
    gt = threading.Thread(target=getter)
    gt.start()
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    done.set()
    gt.join(60)
    assert not any(t.is_alive() for t in ts + [gt])
    assert not errors, errors
    assert gets[0] > 0
    # the last value of every writer's rows is what is stored
    for rows in wrows:
        got = client.get(rows, ["w"])["w"]
        for i, r in enumerate(rows):
            assert torch.equal(got[i], _row_value(r, n_iter - 1))


def test_gil_released_during_put_and_get(client, fresh_rows):
    """While one thread moves 64 MiB per call, a pure-Python thread keeps
    counting. The switch interval is made long so that the counter can only run
    when the mover gives the GIL up by itself (inside the C calls)."""
    rows = fresh_rows(64)
    data = torch.randn(64, 256 * 1024)  # 64 x 1 MiB
    client.put(rows, {"big": data})  # warm up: connections, registrations
    count = [0]
    stop = threading.Event()

    def counter():
        n = 0
        while not stop.is_set():
            n += 1
            count[0] = n
            if n % 2000 == 0:
                time.sleep(0.0002)  # hand the GIL back to the mover now and then

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    th = threading.Thread(target=counter)
    try:
        th.start()
        while count[0] == 0:
            time.sleep(0.001)
        advanced = 0
        for _ in range(3):
            before = count[0]
            client.put(rows, {"big": data})
            advanced += count[0] - before
            before = count[0]
            got = client.get(rows, ["big"])["big"]
            advanced += count[0] - before
    finally:
        stop.set()
        th.join(30)
        sys.setswitchinterval(old)
    for i in (0, 31, 63):
        assert torch.equal(got[i], data[i])
    assert advanced > 1000, advanced
