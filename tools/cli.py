"""The ``trainingcxl`` command line.

  trainingcxl verilog -o DIR          Verilog of the device (DIR/trainingcxl_device.v)
  trainingcxl verilog --board u200    the Alveo U200 board top: Verilog, XDC, port map (build/board)
  trainingcxl lint                    verilator --lint-only -Wall on both (hw/trainingcxl.vlt)
  trainingcxl stress --channel mem    random CXL.mem stress on Verilator, JSON + table
  trainingcxl stress --channel cache  CXL.cache coherence stress (device vs host CPU cache)
  trainingcxl bench --json FILE       named performance figures, JSON + table
  trainingcxl regmap --format md      register map as Markdown / Python / C
  trainingcxl trace --preset P        a seeded DLRM trace (TBE layout, documented .npz format)
  trainingcxl run --model M ...       a model's embedding phase on the RTL, verified, JSON + table
  trainingcxl crash --points N ...    power-failure campaign: cut, recover, check, resume; JSON + table
  trainingcxl fuzz --target T         adversarial CXL.mem / CXL.cache / NDP traffic, checked; JSON + table
  trainingcxl eval --models rm1,...   the paper's evaluation (PMEM/PCIe/CXL-D/CXL-B/CXL), JSON + report
  trainingcxl synth [--target xcup]   yosys synth_xilinx: LUT/FF/BRAM/URAM/DSP, logic levels, JSON + table
  trainingcxl fp32 --n 1000000        FP32 units against the exact reference, JSON + table (--pipeline deep)
  trainingcxl waves TEST              open the last waveform of TEST in GTKWave

Every simulation command prints its seed and accepts --seed to replay. Results go to the
--json file (the keys are the contract) and a table on stdout.
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.cli_args import (CliError, CliParser, check_output_path, non_negative_int,  # noqa: E402
                             positive_int, seed_int)

TOP_NAME = "trainingcxl_device"


def _config(args):
    import dataclasses
    from hw.config import DeviceConfig
    cfg = DeviceConfig.for_simulation() if getattr(args, "sim_config", False) else DeviceConfig()
    if getattr(args, "clock_mhz", None):
        cfg = dataclasses.replace(cfg, clock_mhz=args.clock_mhz)
    return cfg


def cmd_verilog(args) -> int:
    if getattr(args, "board", None):
        from tools.board_cmd import cmd_board_verilog
        return cmd_board_verilog(args, _config(args))
    from amaranth.back import verilog
    from hw.top import TrainingCxlDevice
    out = pathlib.Path(args.output or "build/verilog")
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(args)
    text = verilog.convert(TrainingCxlDevice(cfg), name=TOP_NAME, emit_src=False)
    path = out / f"{TOP_NAME}.v"
    path.write_text(text)
    print(f"wrote {path} ({len(text.splitlines())} lines; {cfg.channels} channels, "
          f"{cfg.capacity_bytes >> 20} MiB, {cfg.clock_mhz} MHz)")
    return 0


def cmd_lint(args) -> int:
    import subprocess
    from sim import runner
    runner.setup_path()
    out = REPO / "build" / "verilog"
    args.output = str(out)
    cmd_verilog(args)
    waivers = REPO / "hw" / "trainingcxl.vlt"
    cmd = ["verilator", "--lint-only", "-Wall", "--top-module", TOP_NAME, str(waivers),
           str(out / f"{TOP_NAME}.v")]
    print("$", " ".join(cmd))
    result = subprocess.run(cmd)
    media = REPO / "sim" / "rtl" / "pmem_media.sv"
    cmd2 = ["verilator", "--lint-only", "-Wall", "--top-module", "pmem_media", str(media)]
    print("$", " ".join(cmd2))
    result2 = subprocess.run(cmd2)
    # The board top (hw/board/): the same device behind flat AMBA ports.
    from tools.board_cmd import lint_command, write_board
    board = write_board("u200", REPO / "build" / "board")
    print(f"wrote {board['verilog']} (the U200 board top)")
    cmd3 = lint_command(board["verilog"])
    print("$", " ".join(cmd3))
    result3 = subprocess.run(cmd3)
    ok = result.returncode == 0 and result2.returncode == 0 and result3.returncode == 0
    print("lint clean" if ok else "lint FAILED")
    return 0 if ok else 1


def _run_harness_test(testcase: str, env: dict[str, str], module: str = "sim.tb.cxl_mem_tb") -> dict:
    from tools.harness_run import NoResult, run_harness_test
    try:
        return run_harness_test(testcase, env, module)
    except NoResult as e:
        raise SystemExit(str(e)) from None


def _table(title: str, rows: dict) -> str:
    width = max(len(k) for k in rows)
    lines = [title, "-" * len(title)]
    for k, v in rows.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, dict):
            v = "(see the JSON)"
        lines.append(f"{k:<{width}}  {v}")
    return "\n".join(lines)


def _emit(result: dict, json_path: str | None, title: str) -> None:
    from tools.harness_run import write_json
    print(_table(title, result))
    if json_path:
        write_json(json_path, result)


def _seed(args) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed {seed} (replay with --seed {seed})", flush=True)
    return seed


STRESS = {   # --channel -> (cocotb module, test, title)
    "mem": ("sim.tb.cxl_mem_tb", "random_stress", "CXL.mem stress"),
    "cache": ("sim.tb.cxl_cache_tb", "coherence_stress", "CXL.cache coherence stress"),
}


def cmd_stress(args) -> int:
    seed = _seed(args)
    module, test, title = STRESS[args.channel]
    env = {"TCXL_SEED": str(seed), "TCXL_TRANSACTIONS": str(args.transactions)}
    if args.trace:
        env["TCXL_TRACE"] = str(pathlib.Path(args.trace).resolve())
    result = _run_harness_test(test, env, module)
    _emit(result, args.json, f"{title}, {args.transactions} transactions")
    ok = not result.get("error") and all(
        result.get(k, 0) == 0 for k in ("mismatches", "protocol_violations",
                                         "coherence_violations"))
    return 0 if ok else 1


def cmd_bench(args) -> int:
    seed = _seed(args)
    t0 = time.perf_counter()
    stream = _run_harness_test("streaming_read_bandwidth", {
        "TCXL_SEED": str(seed), "TCXL_BENCH_LINES": str(args.lines)})
    stress = _run_harness_test("random_stress", {
        "TCXL_SEED": str(seed), "TCXL_TRANSACTIONS": str(args.transactions)})
    push = _run_harness_test("push_stream_bandwidth", {
        "TCXL_SEED": str(seed), "TCXL_BENCH_LINES": str(args.lines)}, "sim.tb.cxl_cache_tb")
    overhead = {}   # "{model}_b{B}" -> sim/tb/overhead_tb.py's result
    for model, batch_size in args.overhead_runs:
        print(f"bench: checkpoint overhead {model} batch {batch_size} rows cap {args.overhead_rows_cap}",
              file=sys.stderr, flush=True)
        overhead[f"{model}_b{batch_size}"] = _run_harness_test("checkpoint_overhead", {
            "TCXL_SEED": str(seed), "TCXL_OVH_MODEL": model, "TCXL_OVH_BATCH_SIZE": str(batch_size),
            "TCXL_OVH_ROWS_CAP": str(args.overhead_rows_cap), "TCXL_OVH_BATCHES": str(args.overhead_batches),
            "TCXL_OVH_MLP_PROBE": "4096"}, "sim.tb.overhead_tb")
    engine = _engine_run(seed, args)
    # Issue 15: every model's engine efficiencies, and the row cache's effect (same runs without it).
    engines = _engine_keys("engine", args.engines, args.engines_rows_cap, seed)
    engines |= _engine_keys("row_cache_off", args.row_cache_off, args.engines_rows_cap, seed, cache_lines=0)
    from hw.config import DeviceConfig
    from sim.model.pmem_params import describe
    cfg = DeviceConfig.for_simulation()
    result = {
        "cxlmem_read_efficiency": round(stream["cxlmem_read_efficiency"], 4),
        "cxlmem_read_lines_per_cycle": round(stream["lines_per_cycle"], 4),
        "media_read_lines_per_cycle": round(stream["media_read_lines_per_cycle"], 4),
        "sim_cycles_per_second": stress["sim_cycles_per_second"],
        "stress_sim_cycles_per_second": stress["sim_cycles_per_second"],
        **({} if engine is None else {
            "engine_run": engine["label"],
            "engine_run_sim_cycles_per_second": engine["sim_cycles_per_second"],
            "engine_run_sim_cycles": engine["sim_cycles"],
            "engine_run_wall_seconds": engine["wall_seconds"],
            "engine_run_verified": engine["verified"],
            "engine_run_lookup_efficiency": engine["lookup_efficiency"],
            "engine_run_update_efficiency": engine["update_efficiency"],
            "engine_run_lookup_physical_efficiency": engine["lookup_physical_efficiency"],
            "engine_run_update_physical_efficiency": engine["update_physical_efficiency"]}),
        **engines,
        "stream_sim_cycles_per_second": stream["sim_cycles_per_second"],
        "stress_transactions": stress["transactions"],
        "stress_cycles": stress["cycles"],
        "stress_mismatches": stress["mismatches"],
        "stress_protocol_violations": stress["protocol_violations"],
        "cache_push_efficiency": push["cache_push_efficiency"],
        **{f"checkpoint_overhead_{sched}_{run}": r.get(f"overhead_{sched}")
           for run, r in overhead.items()
           for sched in ("cxl_b", "cxl_d", "cxl_b_emb_only", "cxl_b_emb_only_at_log_floor")},
        **{f"checkpoint_log_floor_efficiency_{run}": r.get("log_floor_efficiency") for run, r in overhead.items()},
        "checkpoint_overhead_runs": {run: {k: v for k, v in r.items() if k != "batches"}
                                     for run, r in overhead.items()},
        "clock_mhz": cfg.clock_mhz,
        "seed": seed,
        "bench_wall_seconds": round(time.perf_counter() - t0, 1),
        **{f"pmem_{k}": v for k, v in describe(cfg.clock_mhz).items()
           if isinstance(v, (int, float))},
    }
    _emit(result, args.json, "TrainingCXL bench")
    ok = not any(r.get("error") for r in (stream, stress, push, *overhead.values())) and \
        all(r.get("verified") for r in overhead.values()) and (engine is None or engine["verified"]) and \
        all(v for k, v in engines.items() if k.endswith("_verified"))
    return 0 if ok else 1


def _embedding_run(model: str, batch_size: int, rows_cap: int, seed: int, cache_lines: int | None = None) -> dict:
    """``trainingcxl run --model M --config cxl-d --phase embedding --batches 1`` (every result
    verified as in ``run``); ``label`` is the command line that reproduces it."""
    from tools.run_cmd import run_embedding
    run_args = argparse.Namespace(
        model=model, config="cxl-d", phase="embedding", batches=1, trace=None, seed=seed,
        rows_cap=rows_cap, batch_size=batch_size, out="host", fp32_pipeline="compact",
        lookup_cache_lines=cache_lines)
    print(f"bench: {model} batch {batch_size} rows cap {rows_cap}"
          + ("" if cache_lines is None else f", row cache {cache_lines} lines"), file=sys.stderr, flush=True)
    result = run_embedding(run_args)
    result["label"] = (f"trainingcxl run --model {model} --config cxl-d --phase embedding --batches 1 "
                       f"--batch-size {batch_size} --rows-cap {rows_cap} --seed {seed}"
                       + ("" if cache_lines is None else f" --lookup-cache-lines {cache_lines}"))
    return result


def _engine_run(seed: int, args) -> dict | None:
    """The simulation-speed run of issue 14: rm1 at the bench's batch size and rows cap (LOOKUP
    and UPDATE dominate). None with ``--engine-batch-size 0``."""
    if not args.engine_batch_size:
        return None
    return _embedding_run("rm1", args.engine_batch_size, args.engine_rows_cap, seed)


ENGINE_FIGURES = ("cycles_lookup", "lookup_efficiency", "lookup_physical_efficiency", "lookup_cache_hit_rate",
                  "lookup_feeder_efficiency",
                  "cycles_update", "update_efficiency", "update_physical_efficiency", "verified")


def _engine_keys(prefix: str, runs: list[tuple[str, int]], rows_cap: int, seed: int,
                 cache_lines: int | None = None) -> dict:
    """Issue 15's named keys: ``{prefix}_{model}_b{B}_{figure}`` per run, plus its command line."""
    out = {}
    for model, batch in runs:
        r = _embedding_run(model, batch, rows_cap, seed, cache_lines)
        key = f"{prefix}_{model}_b{batch}"
        out.update({f"{key}_{f}": r.get(f) for f in ENGINE_FIGURES})
        out[f"{key}_run"] = r["label"]
    return out


def _model_batches(text: str) -> list[tuple[str, int]]:
    """``rm1:64,rm4:512`` -> [("rm1", 64), ("rm4", 512)]; empty text -> []."""
    runs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        model, _, batch = item.partition(":")
        if not batch.isdigit() or int(batch) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: expected MODEL:BATCH, e.g. rm1:64")
        runs.append((model, int(batch)))
    return runs


def cmd_fp32(args) -> int:
    from sim.tb.fp32_campaign import OPS, run_fp32_campaign
    seed = _seed(args)
    ops = list(OPS) if args.op == "all" else [args.op]
    results = {op: run_fp32_campaign(op, args.n, seed, args.pipeline) for op in ops}
    flat = {"pipeline": args.pipeline}
    for op, r in results.items():
        flat[f"{op}_vectors"] = r["vectors"]
        flat[f"{op}_mismatches"] = r["mismatches"]
        flat[f"{op}_seconds"] = round(r["seconds"], 2)
        for i, mm in enumerate(r.get("first_mismatches", [])[:3]):
            flat[f"{op}_mismatch_{i}"] = str(mm)
    flat["seed"] = seed
    _emit(flat, args.json, f"FP32 units ({args.pipeline} pipeline) against the exact reference, "
                           f"{args.n} vectors per operator")
    return 1 if any(r["mismatches"] for r in results.values()) else 0


def cmd_regmap(args) -> int:
    from tools import regmap
    text = {"md": regmap.markdown, "py": regmap.python_constants,
            "c": regmap.c_header}[args.format]()
    if args.output:
        pathlib.Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_waves(args) -> int:
    from tools.waves import open_waves
    return open_waves(args.test, no_gui=args.no_gui)


def main(argv=None) -> int:
    p = CliParser(prog="trainingcxl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("verilog", help="write the device's Verilog")
    v.add_argument("-o", "--output", help="output folder (build/verilog; build/board with --board)")
    v.add_argument("--sim-config", action="store_true",
                   help="the simulation configuration (small memory) instead of the default")
    v.add_argument("--board", choices=["u200"],
                   help="the board integration top instead (hw/board/): Verilog, XDC template, port map")
    v.add_argument("--clock-mhz", type=positive_int,
                   help="the clock the device will run at (CLOCK_MHZ CSR; the XDC period with --board); "
                        "default DeviceConfig.clock_mhz")
    v.set_defaults(func=cmd_verilog)

    lint = sub.add_parser("lint", help="verilator --lint-only -Wall on the generated Verilog")
    lint.set_defaults(func=cmd_lint)

    s = sub.add_parser("stress", help="random stress on Verilator")
    s.add_argument("--channel", choices=["mem", "cache"], default="mem")
    s.add_argument("--transactions", type=positive_int, default=20000)
    s.add_argument("--seed", type=seed_int)
    s.add_argument("--json", help="write the result here")
    s.add_argument("--trace", help="(cache) write every CXL.cache message to this file")
    s.set_defaults(func=cmd_stress)

    b = sub.add_parser("bench", help="performance figures (JSON)")
    b.add_argument("--json", default="build/bench.json")
    b.add_argument("--lines", type=positive_int, default=8192, help="lines in the streaming read")
    b.add_argument("--transactions", type=positive_int, default=20000, help="stress size")
    b.add_argument("--seed", type=seed_int)
    b.add_argument("--overhead-batches", type=positive_int, default=1,
                   help="measured batches per checkpoint-overhead run (after one warm-up batch)")
    b.add_argument("--overhead-runs", type=_model_batches, default="rm1:64,rm1:512,rm4:64,rm4:512",
                   metavar="MODEL:B,...",
                   help="checkpoint-overhead runs (keys checkpoint_overhead_{cxl_b,cxl_d,cxl_b_emb_only,"
                        "cxl_b_emb_only_at_log_floor}_MODEL_bB and checkpoint_log_floor_efficiency_MODEL_bB; "
                        "'' skips them)")
    b.add_argument("--overhead-rows-cap", type=positive_int, default=4096,
                   help="rows cap of the checkpoint-overhead runs")
    b.add_argument("--engine-batch-size", type=non_negative_int, default=512,
                   help="batch size of the rm1 engine run whose simulation speed is reported (0: skip it)")
    b.add_argument("--engine-rows-cap", type=positive_int, default=65536,
                   help="rows cap of the rm1 engine run")
    b.add_argument("--engines", type=_model_batches, default="rm1:64,rm2:64,rm3:64,rm4:64,rm1:512,rm2:512,rm3:512,"
                   "rm4:512", metavar="MODEL:B,...",
                   help="engine-efficiency runs (keys engine_MODEL_bB_*; '' skips them)")
    b.add_argument("--row-cache-off", type=_model_batches, default="rm1:64,rm4:512", metavar="MODEL:B,...",
                   help="the same runs on a device without the LOOKUP row cache (keys row_cache_off_MODEL_bB_*; "
                        "another Verilator build; '' skips them)")
    b.add_argument("--engines-rows-cap", type=positive_int, default=4096,
                   help="rows cap of the engine-efficiency runs")
    b.set_defaults(func=cmd_bench)

    f = sub.add_parser("fp32", help="bit-exact campaign of the FP32 units (FMA, add, mul, div)")
    f.add_argument("--op", default="all", choices=["fma", "add", "mul", "div", "all"])
    f.add_argument("--n", type=positive_int, default=1_000_000, help="vectors per operator")
    f.add_argument("--seed", type=seed_int)
    from sim.tb.fp32_campaign import PIPELINES as FP32_PIPELINES
    f.add_argument("--pipeline", default="compact", choices=FP32_PIPELINES,
                   help="which pipeline of the units (hw/common/fp32.py): the default, the deep one, or the "
                        "deep FMA fed its addend two cycles late (deep_late_c, as UPDATE feeds it)")
    f.add_argument("--json", help="write the result here")
    f.set_defaults(func=cmd_fp32)

    r = sub.add_parser("regmap", help="the register map as Markdown, Python or C")
    r.add_argument("--format", choices=["md", "py", "c"], default="md")
    r.add_argument("-o", "--output")
    r.set_defaults(func=cmd_regmap)

    w = sub.add_parser("waves", help="open the last waveform of a test in GTKWave")
    w.add_argument("test", help="cocotb test name, e.g. random_stress")
    w.add_argument("--no-gui", action="store_true", help="only write the .gtkw save file")
    w.set_defaults(func=cmd_waves)

    from tools.trace_cmd import add_trace_parser
    add_trace_parser(sub)
    from tools.run_cmd import add_run_parser
    add_run_parser(sub)
    from tools.crash_cmd import add_crash_parser
    add_crash_parser(sub)
    from tools.eval_cmd import add_eval_parser
    add_eval_parser(sub)
    from tools.synth_cmd import add_parser as add_synth_parser
    add_synth_parser(sub)
    from tools.mem_audit import add_parser as add_memaudit_parser
    add_memaudit_parser(sub)
    from tools.fuzz_cmd import add_fuzz_parser
    add_fuzz_parser(sub)

    args = p.parse_args(argv)
    try:
        for option, folder in (("json", False), ("report", True)):
            if getattr(args, option, None):
                check_output_path(f"--{option}", getattr(args, option), folder=folder)
        return args.func(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
