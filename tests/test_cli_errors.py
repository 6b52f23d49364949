"""Every bad argument of ``trainingcxl`` ends with exit status 2 and one line on stderr that
names what is wrong: no traceback, no usage dump, and no simulator started (the harness build
is replaced by a function that fails the test if it is reached)."""
import pytest

from tools import cli

BAD = [
    # run
    "run --model nope --batches 1",
    "run --model rm-tiny --batches 0",
    "run --model rm-tiny --batches -2",
    "run --model rm-tiny --batches 1 --rows-cap 0",
    "run --model rm-tiny --batches 1 --batch-size 0",
    "run --model rm-tiny --batches 1 --seed xyz",
    "run --model rm-tiny --batches 1 --seed -1",
    "run --model rm-tiny --trace /nonexistent/trace.npz",
    "run --model rm-tiny",                                     # neither --batches nor --trace
    "run --model rm-tiny --batches 1 --config pcie",           # the other configurations: eval
    "run --model rm-tiny --batches 1 --phase training",
    "run --model rm1 --batches 1 --batch-size 1000000",        # no simulated device holds it
    "run --model rm-tiny --batches 1 --json /proc/no/such.json",
    "run --model rm-tiny --batches 1 --json /",
    # crash
    "crash --model nope --points 1",
    "crash --model rm-tiny --points 0",
    "crash --model rm-tiny",                                   # neither --points nor --exhaustive
    "crash --exhaustive --stride 0",
    "crash --model rm-tiny --points 1 --rows-cap 0",
    "crash --model rm-tiny --points 1 --phases lookup,nope",
    "crash --model rm-tiny --points 1 --trace /nonexistent/trace.npz",
    "crash --model rm2 --points 1",                            # does not fit the 1 GiB device
    "crash --model rm-tiny --points 2 --workers 0",
    "crash --exhaustive --workers 2",                          # shard --exhaustive with --boundaries
    "fuzz --target ndp --commands 4 --chunk 0",
    # eval
    "eval --models nope",
    "eval --configs nope",
    "eval --batches 0",
    "eval --models rm1 --batch-size 0",
    "eval --report /proc/no/such",
    # trace
    "trace --preset nope --batches 1 -o build/never.npz",
    "trace --preset rm-tiny --batches 0 -o build/never.npz",
    "trace --preset rm-tiny --batches 1",                      # no -o
    "trace import --format criteo /nonexistent -o build/never.npz",
    "trace import --format criteo-tsv /nonexistent -o build/never.npz",
    "trace stats /nonexistent.npz",
    # the rest
    "stress --transactions 0",
    "stress --channel nope",
    "bench --lines 0",
    "bench --overhead-batches 0",
    "bench --engine-batch-size -1",
    "bench --engine-rows-cap 0",
    "fp32 --n 0",
    "fp32 --op nope",
    "verilog --clock-mhz 0",
    "memaudit --config nope",
    "waves no_such_test --no-gui",
    "fuzz --target nope",
    "fuzz --target ndp --messages 10",
    "fuzz --target cxl-mem --messages 0",
    "nosuchcommand",
]


@pytest.fixture(autouse=True)
def no_simulator(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a bad argument reached the simulator build")
    import sim.harness
    monkeypatch.setattr(sim.harness, "build_harness", refuse)


@pytest.mark.parametrize("argv", BAD)
def test_bad_argument_is_one_line(argv, capsys):
    try:
        rc = cli.main(argv.split())
    except SystemExit as e:             # argparse
        rc = e.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1, err
    assert "error" in lines[0], err
