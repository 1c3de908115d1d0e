"""The C++ hot path (evotuner/runtime/fastpath.cpp) on the CPU: it builds against this torch,
its key agrees with the Python path's _plan_key, its pointer binding equals ArgBinder's byte
for byte, a whole call runs through it (with a stand-in for cuLaunchKernelEx and
cuMemsetD8Async, CPU tensors, stream 0), registration races look-ups safely, and a build
that cannot succeed leaves the Python path on with one line why."""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.config import KernelConfig  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import fastpath  # noqa: E402
from evotuner.runtime.binder import ArgBinder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
M64 = (1 << 64) - 1
ROLES = ("q", "k", "v", "o", "lse", "workspace", "scratch")
#: Where each role's pointer sits in the synthetic argument bytes: raw 8-byte pointers and
#: tensor-map-like address fields (bits 4..47 at a shift, inside a 16-byte window of other bits).
PLACES = {"q": (16, 4), "k": (64, 40), "v": (96, 4), "o": (160, 28), "lse": (200, 4), "workspace": (224, 50),
          "scratch": (256, 4)}
GEOMETRY = (3, 2, 1, 384, 1, 1, 4096)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _make(roles, size=320, seed=7):
    rng = random.Random(seed)
    background = bytes(rng.randrange(256) for _ in range(size))

    def make(ptrs):
        buf = bytearray(background)
        for role in roles:
            off, shift = PLACES[role]
            window = int.from_bytes(buf[off:off + 16], "little")
            mask = ((1 << 44) - 1) << shift
            buf[off:off + 16] = ((window & ~mask) | ((ptrs[role] >> 4) << shift)).to_bytes(16, "little")
        return bytes(buf)
    return make


def _binder(roles):
    ptrs = {r: (i + 1) << 32 for i, r in enumerate(roles)}
    binder = ArgBinder.derive(_make(roles), ptrs)
    assert binder is not None and binder.roles == roles
    return binder


def _fields(binder):
    return tuple((f.offset, f.width, f.shift, f.keep & M64, f.keep >> 64, f.slot) for f in binder.fields)


@pytest.fixture(scope="module")
def native():
    if shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja here: the fast path cannot build")
    state = fastpath.build()
    assert state.startswith("on ("), state
    mod = fastpath.native()
    assert mod.BUILD_KEY == fastpath.build_key()
    mod.clear()
    yield mod
    mod.clear()
    mod.configure(KernelConfig, fastpath._launch_failed)


class FakeDriver:
    """A cuLaunchKernelEx stand-in: records what the C++ side passed."""

    def __init__(self, nbytes, code=0):
        self.nbytes, self.code, self.local = nbytes, code, threading.local()
        self.launches = []
        self.launch = LAUNCH(self._launch)

    def _launch(self, config, function, params, extra):
        fields = ctypes.cast(config, ctypes.POINTER(ctypes.c_uint * 7)).contents
        stream = ctypes.c_void_p.from_address(config + 32).value or 0
        arg = ctypes.c_void_p.from_address(params).value
        self.local.args = ctypes.string_at(arg, self.nbytes)
        self.launches.append((tuple(fields), stream, function, extra))
        return self.code

    def address(self):
        return ctypes.cast(self.launch, ctypes.c_void_p).value


def _spec(binder, driver, q, *, lse=False, workspace=0, scratch=False, owner=None, choice="choice"):
    B, H, Sq, _ = q.shape
    return (binder.template, _fields(binder), lse, bool(workspace), scratch, GEOMETRY, 0xF00D0, driver.address(),
            tuple(q.shape), (B, H, Sq) if lse else None, owner, choice)


def _qkv(B=2, H=4, S=64, D=64, dtype=torch.float16, Sk=None, Hk=None):
    return (torch.randn(B, H, S, D).to(dtype), torch.randn(B, Hk or H, Sk or S, D).to(dtype),
            torch.randn(B, Hk or H, Sk or S, D).to(dtype))


FLAGS = (False, None, None, "bhsd", False, None)


def test_bind_equals_argbinder_byte_for_byte(native):
    rng = random.Random(3)
    for roles in (ROLES[:4], ROLES[:5], ROLES[:4] + ("workspace",), ROLES):
        binder = _binder(roles)
        assert {f.width for f in binder.fields} == {8, 16}
        for _ in range(200):
            ptrs = {r: rng.randrange(1, 1 << 44) << 4 for r in roles}
            want = binder.bind(ptrs)
            assert native.bind(binder.template, _fields(binder), [ptrs[r] for r in roles]) == want
            assert want == _make(roles)(ptrs)


def test_fields_that_do_not_fit_are_refused_by_bind_and_register(native):
    binder, driver = _binder(ROLES[:4]), FakeDriver(320)
    n = len(binder.template)
    for bad in ((n - 4, 8, 0, 0, 0, 0), (0, 12, 0, 0, 0, 0), (0, 8, 21, 0, 0, 0)):   # past the end, odd width, shift
        fields = [bad, *_fields(binder)[1:]]
        with pytest.raises(ValueError, match="bind: a field does not fit"):
            native.bind(binder.template, fields, [16] * 4)
        spec = _spec(binder, driver, _qkv()[0])
        spec = (spec[0], fields, *spec[2:])
        with pytest.raises(ValueError, match="register: a field does not fit"):
            native.register(*_qkv(), *FLAGS[:4], False, None, spec, 0, 0, 0)


def test_fields_naming_no_pointer_or_leaving_one_out_are_refused(native):
    binder, driver = _binder(ROLES[:4]), FakeDriver(320)
    fields = _fields(binder)
    for bad, what in (([*fields[:3], (*fields[3][:5], 4)], "a field names pointer 4 of 4"),   # slot past the pointers
                      (fields[:3], "pointer 3 has no field")):                       # o left out
        with pytest.raises(ValueError, match=f"bind: {what}"):
            native.bind(binder.template, bad, [16] * 4)
        spec = _spec(binder, driver, _qkv()[0])
        with pytest.raises(ValueError, match=f"register: {what}"):
            native.register(*_qkv(), *FLAGS[:4], False, None, (spec[0], bad, *spec[2:]), 0, 0, 0)


def test_a_pointer_in_two_places_is_bound_in_both(native):
    """The hopper kernel's SCHED 3 holds O twice (its tensor map's address and o_ptr): the binder
    finds both places, and Python and C++ bind them alike."""
    roles = ROLES[:4]
    plain = _make(roles)

    def make(ptrs):   # o again as a raw pointer at byte 304
        buf = bytearray(plain(ptrs))
        buf[304:312] = ptrs["o"].to_bytes(8, "little")
        return bytes(buf)

    binder = ArgBinder.derive(make, {r: (i + 1) << 32 for i, r in enumerate(roles)})
    assert binder is not None and binder.roles == roles
    assert [f.role for f in binder.fields].count("o") == 2 and len(binder.fields) == 5
    rng = random.Random(5)
    for _ in range(50):
        ptrs = {r: rng.randrange(1, 1 << 44) << 4 for r in roles}
        want = make(ptrs)
        assert binder.bind(ptrs) == want
        assert native.bind(binder.template, _fields(binder), [ptrs[r] for r in roles]) == want


def test_a_whole_call_runs_through_the_table(native):
    native.clear()
    roles = ROLES[:5] + ("workspace",)
    binder, driver = _binder(roles), FakeDriver(320)
    q, k, v = _qkv()
    owner = SimpleNamespace()
    assert native.register(q, k, v, *FLAGS[:4], True, None, _spec(binder, driver, q, lse=True, workspace=64,
                                                                    owner=owner, choice="why"), 0, 1 << 20, 0)
    q2, k2, v2 = _qkv()
    out, lse, choice = native.run(q2, k2, v2, *FLAGS[:4], True, None, True)
    assert choice == "why" and out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 4, 64)
    assert lse.dtype == torch.float32 and out.data_ptr() != q2.data_ptr()
    ptrs = {"q": q2.data_ptr(), "k": k2.data_ptr(), "v": v2.data_ptr(), "o": out.data_ptr(), "lse": lse.data_ptr(),
            "workspace": 1 << 20}
    assert driver.local.args == binder.bind(ptrs)
    assert driver.launches == [(GEOMETRY, 0, 0xF00D0, None)]
    out2, lse2 = native.run(q2, k2, v2, *FLAGS[:4], True, None, False)
    assert out2.data_ptr() != out.data_ptr() and len(driver.launches) == 2
    # the same plan under return_lse=False is another key
    assert native.run(q2, k2, v2, *FLAGS, False) is None
    # a stream without registered buffers takes the Python path, and is served once registered
    native.clear()
    assert native.register(q, k, v, *FLAGS[:4], True, None, _spec(binder, driver, q, lse=True, workspace=64), 0, 0,
                           0)
    assert native.run(q2, k2, v2, *FLAGS[:4], True, None, False) is None
    assert native.register(q, k, v, *FLAGS[:4], True, None, _spec(binder, driver, q, lse=True, workspace=64), 0,
                           4096, 0)
    assert native.run(q2, k2, v2, *FLAGS[:4], True, None, False) is not None
    assert native.counts() == (1, 1, 1)


def test_flash_attention_takes_the_table_first(native):
    """The public call: a plan registered under its arguments serves it (here a CPU stand-in,
    which the Python path would refuse as not on a CUDA device)."""
    native.clear()
    binder, driver = _binder(ROLES[:4]), FakeDriver(320)
    q, k, v = _qkv()
    assert native.register(q, k, v, *FLAGS, _spec(binder, driver, q, choice="c"), 0, 0, 0)
    out = evotuner.flash_attention(q, k, v)
    assert out.shape == q.shape and len(driver.launches) == 1
    assert evotuner.flash_attention(q, k, v, return_choice=True)[1] == "c"
    with pytest.raises(evotuner.errors.ShapeError, match="CUDA device"):
        evotuner.flash_attention(q, k, v, causal=True)    # another key: the Python path, unchanged
    q.requires_grad_(True)
    with pytest.raises(evotuner.errors.ShapeError, match="CUDA device"):
        evotuner.flash_attention(q, k, v)                 # grad: the Python path decides
    with torch.no_grad():
        assert evotuner.flash_attention(q, k, v).shape == q.shape


def _variants():
    """(name, (q, k, v), flags) calls around one base call."""
    q, k, v = _qkv()
    big = torch.randn(2, 4, 128, 64).half()
    wide = torch.randn(2, 64, 4, 64).half()
    misaligned = torch.randn(2 * 4 * 64 * 64 + 1).half()[1:].view(2, 4, 64, 64)
    scale = 0.125
    cfg = "BLOCK_N=64"
    yield "base", (q, k, v), FLAGS
    yield "fresh tensors", _qkv(), FLAGS
    yield "misaligned q", (misaligned, k, v), FLAGS
    yield "longer q", (torch.randn(2, 4, 80, 64).half(), k, v), FLAGS
    yield "longer k/v", _qkv(Sk=96), FLAGS
    yield "bf16", _qkv(dtype=torch.bfloat16), FLAGS
    yield "gqa", _qkv(Hk=2), FLAGS
    yield "strided q", (big[:, :, :64], k, v), FLAGS
    yield "transposed q", (wide.transpose(1, 2), k, v), FLAGS
    yield "causal", (q, k, v), (True, None, None, "bhsd", False, None)
    yield "scale", (q, k, v), (False, scale, None, "bhsd", False, None)
    yield "scale again", (q, k, v), (False, float("0.125"), None, "bhsd", False, None)
    yield "config str", (q, k, v), (False, None, cfg, "bhsd", False, None)
    yield "config str again", (q, k, v), (False, None, "BLOCK_N=" + str(64), "bhsd", False, None)
    yield "config dict", (q, k, v), (False, None, {"BLOCK_N": 64}, "bhsd", False, None)
    yield "config dict again", (q, k, v), (False, None, dict(BLOCK_N=64), "bhsd", False, None)
    yield "config dict other", (q, k, v), (False, None, {"BLOCK_N": 128}, "bhsd", False, None)
    yield "config object", (q, k, v), (False, None, KernelConfig.of({"BLOCK_N": 64}), "bhsd", False, None)
    yield "config object again", (q, k, v), (False, None, KernelConfig.parse("block_n=64"), "bhsd", False, None)
    yield "bshd", (q, k, v), (False, None, None, "bshd", False, None)
    yield "lse", (q, k, v), (False, None, None, "bhsd", True, None)
    yield "family", (q, k, v), (False, None, None, "bhsd", False, "hopper")


def _python_key(qkv, flags):
    return A._plan_key(*qkv, *flags)


def test_the_key_agrees_with_the_python_paths(native):
    """For every pair of calls: the C++ table serves the second from the first's plan exactly
    when the Python path's _plan_key says they are one key (a misaligned pointer excepted:
    same key, but the C++ side refuses it for the Python path to handle)."""
    calls = list(_variants())
    for name_a, qkv_a, flags_a in calls:
        if name_a == "misaligned q":
            continue
        native.clear()
        binder, driver = _binder(ROLES[:4]), FakeDriver(320)
        assert native.register(*qkv_a, *flags_a, _spec(binder, driver, qkv_a[0]), 0, 0, 0), name_a
        for name_b, qkv_b, flags_b in calls:
            same = _python_key(qkv_a, flags_a) == _python_key(qkv_b, flags_b)
            out = native.run(*qkv_b, *flags_b, False)
            expect = same and name_b != "misaligned q"
            assert (out is not None) == expect, (name_a, name_b, same)
            if out is not None:
                q, k, v = qkv_b
                ptrs = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": out.data_ptr()}
                assert driver.local.args == binder.bind(ptrs)


def test_what_the_table_does_not_serve_takes_the_python_path(native):
    native.clear()
    binder, driver = _binder(ROLES[:4]), FakeDriver(320)
    q, k, v = _qkv()
    assert native.register(q, k, v, *FLAGS, _spec(binder, driver, q), 0, 0, 0)
    assert native.run(q, k, v, *FLAGS, False) is not None
    assert A._plan_key(q, k, v, 1, *FLAGS[1:]) is None
    assert native.run(q, k, v, 1, *FLAGS[1:], False) is None                     # causal not a bool
    assert native.key(q, k, v, 1, *FLAGS[1:]) is None
    assert native.run(torch.nn.Parameter(q), k, v, *FLAGS, False) is None       # a tensor subclass
    assert native.run(q[0], k, v, *FLAGS, False) is None                        # not 4-D
    assert native.run(q, k, v, False, 1, *FLAGS[2:], False) is None             # scale 1 vs None
    odd = {1: 64}                                                               # a key that is no name
    assert native.register(q, k, v, False, None, odd, "bhsd", False, None, _spec(binder, driver, q), 0, 0, 0) is False
    # a dict the caller changes after the call is not served from the old entry
    cfg = {"BLOCK_N": 64}
    assert native.register(q, k, v, False, None, cfg, "bhsd", False, None, _spec(binder, driver, q), 0, 0, 0)
    assert native.run(q, k, v, False, None, cfg, "bhsd", False, None, False) is not None
    cfg["BLOCK_N"] = 128
    assert native.run(q, k, v, False, None, cfg, "bhsd", False, None, False) is None


def test_launch_errors_are_classified_like_the_python_paths(native):
    native.clear()
    binder, wrong = _binder(ROLES[:4]), FakeDriver(320, code=201)
    q, k, v = _qkv()
    assert native.register(q, k, v, *FLAGS, _spec(binder, wrong, q), 0, 0, 0)
    assert native.run(q, k, v, *FLAGS, False) is None and len(wrong.launches) == 1   # another context
    native.clear()
    failing = FakeDriver(320, code=700)
    seen = []

    def failed(code, owner):
        seen.append((code, owner))
        raise RuntimeError(f"launch failed with {code}")

    native.configure(KernelConfig, failed)
    owner = object()
    assert native.register(q, k, v, *FLAGS, _spec(binder, failing, q, owner=owner), 0, 0, 0)
    with pytest.raises(RuntimeError, match="700"):
        native.run(q, k, v, *FLAGS, False)
    assert seen == [(700, owner)]
    native.configure(KernelConfig, fastpath._launch_failed)


def test_registration_races_look_ups_safely(native):
    """Threads calling while another registers and clears: every result is None or a correct
    call (the bytes launched hold that call's own pointers)."""
    native.clear()
    binder, driver = _binder(ROLES[:4]), FakeDriver(320)
    base = _qkv()
    stop, errors, served = threading.Event(), [], [0]

    def caller():
        q, k, v = _qkv()
        while not stop.is_set():
            out = native.run(q, k, v, *FLAGS, False)
            if out is None:
                continue
            want = binder.bind({"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": out.data_ptr()})
            if driver.local.args != want or out.shape != q.shape:
                errors.append("wrong bytes")
            served[0] += 1

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(300):
            native.register(*base, *FLAGS, _spec(binder, driver, base[0]), 0, 0, 0)
            other = _qkv(S=8 + i % 50)
            native.register(*other, False, float(i), None, "bhsd", False, None, _spec(binder, driver, other[0]),
                            0, 0, 0)
            if i % 25 == 24:
                native.clear()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors and served[0] > 0
    flags, plans, _ = native.counts()
    assert flags <= 256 and plans <= 1024


def _fresh_process(env_extra, code, timeout=300):
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH", ""), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


FAIL_CHECK = """
import json
from evotuner.runtime import fastpath as f
first = f.build(timeout_s={timeout})
print(json.dumps({{"first": first, "run": f.run is None}}))
"""


def test_a_build_without_a_compiler_leaves_the_python_path_on(tmp_path):
    env = {"EVOTUNER_CACHE_DIR": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    got = _fresh_process(env, FAIL_CHECK.format(timeout=300))
    assert got["run"] and got["first"].startswith("unavailable: the C++ build failed"), got
    failed = list((tmp_path / "fastpath").glob("*.failed"))
    assert len(failed) == 1 and "failed" in failed[0].read_text()
    # the next process remembers it instead of building again
    again = _fresh_process(env, "import json\nfrom evotuner.runtime import fastpath as f\nf.start()\n"
                                "print(json.dumps(f.status()))")
    assert again.startswith("unavailable: the C++ build failed") and "remembered" in again
    assert [p.name for p in (tmp_path / "fastpath").iterdir()] == [failed[0].name]   # no temp folder left


def test_a_build_past_its_timeout_is_killed_and_not_remembered(tmp_path):
    got = _fresh_process({"EVOTUNER_CACHE_DIR": str(tmp_path)}, FAIL_CHECK.format(timeout=0.5))
    assert got["run"] and got["first"].startswith("unavailable: the build timed out after 0.5 s"), got
    assert list((tmp_path / "fastpath").iterdir()) == []


def test_the_first_call_builds_in_the_background_and_never_blocks(tmp_path):
    code = ("import json, threading\nfrom evotuner.runtime import fastpath as f\nf.start()\nfirst = f.status()\n"
            "[t.join() for t in threading.enumerate() if t.name == 'evotuner-fastpath-build']\n"
            "print(json.dumps([first, f.status()]))")
    first, last = _fresh_process({"EVOTUNER_CACHE_DIR": str(tmp_path), "CXX": str(tmp_path / "none")}, code)
    assert first.startswith("building in the background into "), first
    assert last.startswith("unavailable: the C++ build failed"), last
    off = _fresh_process({"EVOTUNER_FASTPATH": "0"}, "import json\nfrom evotuner.runtime import fastpath as f\n"
                                                     "f.start()\nprint(json.dumps([f.status(), f.build()]))")
    assert off == ["off: $EVOTUNER_FASTPATH=0"] * 2


def test_a_cached_build_loads_on_the_first_call(native):
    code = "import json\nfrom evotuner.runtime import fastpath as f\nf.start()\nprint(json.dumps(f.status()))"
    state = _fresh_process({}, code)
    assert state == f"on ({fastpath.build_dir() / ('evotuner_fastpath_' + fastpath.build_key() + '.so')})"


EXIT_HOLDING = """
import json, sys
from types import SimpleNamespace
sys.path.insert(0, {tests!r})
import test_fastpath as T
from evotuner.runtime import fastpath as f
assert f.build().startswith("on ("), f.status()
mod = f.native()
binder, driver = T._binder(T.ROLES[:4]), T.FakeDriver(320)
q, k, v = T._qkv()
config = {{"BLOCK_N": 128, "STAGES": 2}}     # kept as the table's own copy
spec = T._spec(binder, driver, q, owner=SimpleNamespace(buffers=[q.clone()]), choice=SimpleNamespace(why="x"))
assert mod.register(q, k, v, False, None, config, "bhsd", False, None, spec, 0, 0, 0)
assert mod.run(q, k, v, False, None, dict(config), "bhsd", False, None, False) is not None
print(json.dumps(mod.counts()))
"""


def test_a_process_exits_cleanly_with_plans_in_the_table(native):
    """The table's Python references outlive the interpreter: C++ destroyed them after Python
    had finalized, without the GIL, and freeing a dict config's copy then crashed every process
    that had called flash_attention with a dict config, at exit (SIGSEGV on the H100, rc 139)."""
    assert _fresh_process({}, EXIT_HOLDING.format(tests=str(ROOT / "tests")))[:2] == [1, 1]   # flags, plans held
