"""``trainingcxl lint`` (make lint) as part of the regression: verilator --lint-only -Wall on
the default device's Verilog, the PMEM media model and the U200 board top, with the waivers of
hw/trainingcxl.vlt. Run here so it shares the pytest workers with the other tests instead of
holding up ``make test`` before them."""
import pytest


@pytest.mark.sim
def test_trainingcxl_lint_is_clean(capfd):
    from tools import cli
    rc = cli.main(["lint"])
    out, err = capfd.readouterr()
    assert rc == 0, (out + err)[-4000:]
    assert "lint clean" in out
