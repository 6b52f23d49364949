"""Shared fixtures: the Verilator harness is built once per session and per configuration."""
import json
import sys
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sim import runner  # noqa: E402

runner.setup_path()


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the long campaigns (@pytest.mark.long; make sim-long)")


# Started first: the longest single tests, so that no worker is left with one of them at
# the end while the other idles (pytest-xdist hands out tests in collection order).
START_FIRST = ("tests/test_lint.py::",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(START_FIRST))    # stable: the rest keep their order
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long campaign: make sim-long (pytest --long)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sim_config():
    from hw.config import DeviceConfig
    return DeviceConfig.for_simulation()


@pytest.fixture(scope="session")
def harness(sim_config, tmp_path_factory):
    """(build_dir, env) for the device harness in the simulation configuration."""
    from sim.harness import build_harness, TOPLEVEL
    # With pytest-xdist every worker asks; sim/runner.build serializes builds per folder.
    bdir = build_harness(sim_config)
    env = {"TCXL_CONFIG": json.dumps(sim_config.__dict__)}
    return bdir, TOPLEVEL, env


def run_cocotb(harness, module, testcase, **extra_env):
    bdir, top, env = harness
    return runner.run(bdir, top, module, testcase, env={**env, **{k: str(v) for k, v in
                                                               extra_env.items()}})
