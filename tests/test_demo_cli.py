"""Every demo's command line refuses bad input with one line and exit status 2, never a traceback.

* A bad flag (a non-integer, zero or negative count, min above max, a malformed list) is an argparse error.
* A value the engine refuses (an unreachable hub id, an unknown device, a prompt longer than the model
  takes) is one ``<prog>: error: ...`` line from ``demo.exit_on_bad_input``.
* ``--help`` gives every flag a help text and shows its default.
* Ctrl-C ends a demo with one ``<prog>: interrupted`` line, as killed by SIGINT, not with a traceback.

Every milestone's demo is found by the glob, so later milestones are held to the same rules.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import signal
import subprocess
import sys

import pytest
import torch

import milestones

DEMOS = sorted(m.name for m in pkgutil.iter_modules(milestones.__path__) if m.name[:1] == "m" and m.ispkg)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """A demo sets torch's CPU thread count (``--threads``) and its Ctrl-C hook (``sys.excepthook``); give the
    rest of the session its own back."""
    threads, hook = torch.get_num_threads(), sys.excepthook
    yield
    torch.set_num_threads(threads)
    sys.excepthook = hook


def demo_main(name: str):
    return importlib.import_module(f"milestones.{name}.__main__").main


def run_and_exit(capsys, name: str, argv: list[str]) -> tuple[int, str, str]:
    """Run a demo that must exit; returns (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as info:
        demo_main(name)(argv)
    out, err = capsys.readouterr()
    return info.value.code, out, err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def assert_one_line_error(code: int, stderr: str, *fragments: str) -> None:
    assert code == 2
    assert "Traceback" not in stderr
    (line,) = error_lines(stderr)
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"


# --------------------------------------------------------------------------- bad flags: argparse's one line

BAD_FLAGS = [
    ("m01_naive_loop", ["--max-tokens", "0"], "--max-tokens"),
    ("m01_naive_loop", ["--max-tokens", "ten"], "'ten'"),
    ("m01_naive_loop", ["--prompt-lens", "32,,256"], "'32,,256'"),
    ("m01_naive_loop", ["--prompt-lens", "32,-8"], "--prompt-lens"),
    ("m01_naive_loop", ["--prompt-lens", "a,b"], "--prompt-lens"),
    ("m02_kv_cache", ["--num-prompts", "-2"], "--num-prompts"),
    ("m02_kv_cache", ["--prompt-len", "1.5"], "'1.5'"),
    ("m03_static_batching", ["--min-prompt-len", "50", "--max-prompt-len", "10"],
     "--min-prompt-len (50) is above --max-prompt-len (10)"),
    ("m03_static_batching", ["--min-tokens", "9", "--max-tokens", "3"], "--min-tokens (9) is above --max-tokens (3)"),
    ("m03_static_batching", ["--max-num-seqs", "0"], "--max-num-seqs"),
    ("m04_continuous_batching", ["--long-every", "0"], "--long-every"),
    ("m04_continuous_batching", ["--num-prompts", "zero"], "'zero'"),
    ("m04_continuous_batching", ["--short-tokens", "-1"], "--short-tokens"),
    ("m05_paged_blocks", ["--kv-cache-memory-bytes", "-1"], "--kv-cache-memory-bytes"),
    ("m05_paged_blocks", ["--kv-cache-memory-bytes", "1.5G"], "--kv-cache-memory-bytes"),
    ("m07_chunked_prefill", ["--budgets", "0,256"], "--budgets"),
    ("m08_triton_kernel", ["--shapes", "16x"], "'16x'"),
    ("m09_server", ["--rate", "0"], "--rate"),
    ("m10_cuda_graphs", ["--step-repeats", "0"], "--step-repeats"),
    ("m13_quantization", ["--modes", "int3"], "--modes"),
    ("m13_quantization", ["--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes"),
]
BAD_FLAGS = [case for case in BAD_FLAGS if case[0] in DEMOS]


@pytest.mark.parametrize("name, argv, fragment", BAD_FLAGS, ids=[f"{n[:3]}{' '.join(a)}" for n, a, _ in BAD_FLAGS])
def test_bad_flag_is_one_argparse_line(capsys, name, argv, fragment):
    code, out, err = run_and_exit(capsys, name, argv)
    assert_one_line_error(code, err, fragment)
    assert out == ""  # refused before any engine was built


@pytest.mark.parametrize("name", DEMOS)
@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--repeats", "2.5"], ["--seed", "-1"], ["--seed", "x"]])
def test_common_flags_are_checked_in_every_demo(capsys, name, argv):
    code, out, err = run_and_exit(capsys, name, argv)
    assert_one_line_error(code, err, argv[0])


@pytest.mark.parametrize("name", DEMOS)
def test_every_flag_has_help_and_shows_its_default(capsys, name):
    code, out, _ = run_and_exit(capsys, name, ["--help"])
    assert code == 0
    options = out.split("options:", 1)[1]
    # One block per flag: it starts at a line "  --flag ..." and runs until the next such line.
    blocks = re.split(r"\n(?=  -)", options.strip("\n"))
    flags = [b for b in blocks if not b.lstrip().startswith("-h, --help")]
    assert len(flags) >= 5  # the common flags, at least
    for block in flags:
        text = " ".join(block.split())
        assert "(default:" in text, f"no help text or default shown for: {text}"


# --------------------------------------------------------------------------- refused by the engine: one line


@pytest.mark.parametrize("name", DEMOS)
def test_unreachable_hub_id_is_one_line(capsys, monkeypatch, tmp_path, name):
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("Cannot reach the hub\n\nWe could not connect. Please check your internet connection.\n"
                      "(a hundred more lines of advice and a chained traceback)")

    monkeypatch.chdir(tmp_path)  # so the hub id cannot be a local directory
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    code, out, err = run_and_exit(capsys, name, ["--model", "someorg/does-not-exist", "--device", "cpu"])
    assert_one_line_error(code, err, f"python -m milestones.{name}: error:", "'someorg/does-not-exist'",
                          "OSError: Cannot reach the hub")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", DEMOS)
def test_unknown_device_is_one_line(capsys, name):
    code, _, err = run_and_exit(capsys, name, ["--device", "tpu-ish"])
    assert_one_line_error(code, err, "unknown device 'tpu-ish'")


@pytest.fixture
def small_model(tied_checkpoint, tokenizer_cache) -> str:
    """The tests' tiny checkpoint (vocab 512, at most 512 positions): engines build in a fraction of a second."""
    return str(tied_checkpoint[0])


@pytest.mark.parametrize("name, argv, fragment", [
    # The text prompts go through Qwen3's tokenizer: ids far beyond this model's 512.
    ("m01_naive_loop", [], "text prompts: prompt 0: token ids"),
    ("m02_kv_cache", ["--prompt-len", "600"], "m01_naive_loop: prompt 0: prompt (600 tokens) + max_tokens (16)"),
    ("m03_static_batching", ["--min-prompt-len", "400", "--max-prompt-len", "500", "--max-tokens", "200"],
     "exceeds max_model_len (512)"),
    # Request 0 is a long one (4 tokens here), request 1 the first short one.
    ("m04_continuous_batching", ["--num-prompts", "4", "--long-tokens", "4", "--short-tokens", "500"],
     "m03_static_batching: prompt 1: prompt (32 tokens) + max_tokens (500)"),
])
def test_prompt_the_engine_refuses_is_one_line_naming_the_users_prompt(capsys, small_model, name, argv, fragment):
    """The error names the row and the prompt's index in the demo's workload, and it comes before any work,
    the warm-up included."""
    code, out, err = run_and_exit(capsys, name, ["--model", small_model, "--device", "cpu", *argv])
    assert_one_line_error(code, err, fragment)
    assert "max_tokens (2)" not in err  # the warm-up's request never shows up in an error
    assert "measuring" not in err and "label" not in out  # no run was timed, no table printed


@pytest.mark.parametrize("name", DEMOS)
def test_a_knob_has_the_servers_flag_name_everywhere(capsys, name):
    """One flag per engine knob, vLLM's name (the server's): no demo spells a knob its own way
    (``--kv-cache-memory`` beside the server's ``--kv-cache-memory-bytes``)."""
    from milestones.common.serve_cli import ENGINE_FLAGS

    code, out, _ = run_and_exit(capsys, name, ["--help"])
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out))
    for engine_flag, *_ in ENGINE_FLAGS:
        near = {f for f in flags if f != engine_flag and (f.startswith(engine_flag) or engine_flag.startswith(f))}
        assert not near, f"{name} spells {engine_flag} as {near}"


def test_the_kv_cache_size_reads_in_a_unit_that_shows_it():
    from milestones.m05_paged_blocks.engine import format_bytes

    assert [format_bytes(n) for n in (512, 2**16, 1824 * 1024, 5 * 2**30)] == ["512 bytes", "64.0 KiB", "1.8 MiB",
                                                                              "5.0 GiB"]


def test_ctrl_c_ends_a_demo_with_one_line_and_the_sigint_status():
    code = ("from milestones.common.demo import quiet_ctrl_c\n"
            "quiet_ctrl_c('python -m milestones.mNN')\n"
            "quiet_ctrl_c('installed once')\n"
            "try:\n    raise KeyboardInterrupt\nfinally:\n    print('cleaned up')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout == "cleaned up\n"  # every finally on the way ran first
    assert done.stderr == "python -m milestones.mNN: interrupted\n"
    assert done.returncode == -signal.SIGINT  # a shell sees 130, as for any program Ctrl-C stops


def test_every_other_uncaught_exception_keeps_its_traceback():
    code = "from milestones.common.demo import quiet_ctrl_c\nquiet_ctrl_c('demo')\nraise RuntimeError('a bug')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr and "RuntimeError: a bug" in done.stderr
