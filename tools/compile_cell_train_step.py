"""One paper cell's train step compiled for its TPU slice at a given depth: XLA-TPU's memory.

    python tools/compile_cell_train_step.py co_vs_da "swe_agent c32_da_25" 2 [OVERRIDE ...]

The cell is named as `tools/compile_paper_cells.py` prints it (a prefix is enough); the paper's
layout (`trainer.accumulate=false`) as that tool compiles it; extra Hydra overrides go last
(e.g. `trainer.remat=none`). Prints the trainer's shapes and XLA-TPU's argument, output, alias,
temporary and peak GiB per device (the peak, arguments included, is what a TPU program's
footprint is read from: `ProgramMemory.footprint`) of the train step alone at `layers` decoder
layers, or XLA's refusal, and the compile seconds: the quick probe behind the per-layer figures in
experiments/LOG.md (session 23). Compiler figures for the TPU (libtpu, no TPU needed).
"""

import argparse
import dataclasses
import time

from locoexp.compose import cell_of, compose_configs, sweep_jobs, use_cpu_backend

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("cell")
    parser.add_argument("layers", type=int)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    use_cpu_backend()
    from locoexp.compiled import programs  # noqa: PLC0415  (jax after the backend is chosen)
    from locoexp.compiled.topology import topology_devices  # noqa: PLC0415
    from locoexp.compiled.verdict import run_shapes  # noqa: PLC0415

    argv = ["-m", f"+experiment={args.experiment}", "trainer.accumulate=false", *args.overrides]
    jobs = sweep_jobs(argv)
    cells = [cell_of([o for o in job if not o.startswith("trainer.accumulate=")]) for job in jobs]
    matched = [job for job, cell in zip(jobs, cells, strict=True) if cell.startswith(args.cell)]
    if not matched:
        raise SystemExit(f"no cell {args.cell!r} in {args.experiment}")
    (config,) = compose_configs(matched[:1])
    shapes = run_shapes(config)
    t = shapes.plan.trainer_shape
    print(
        f"{args.cell}: {t.rows} rows x {t.row_tokens} tokens, {t.loss_slots} loss slots per "
        f"device; remat={shapes.trainer.remat.value} attention={shapes.trainer.attention.value}"
    )
    devices, _ = programs.role_devices(shapes, topology_devices(config.hardware))
    model = dataclasses.replace(shapes.model, num_layers=args.layers)
    trainer = programs.build_trainer(shapes, model, devices)
    n = trainer.devices
    batch = trainer.abstract_batch(t.rows * n, t.row_tokens, t.loss_slots * n)
    begin = time.perf_counter()
    lowered = trainer.lower_step(batch)
    try:
        m = lowered.compile().memory_analysis()
    except Exception as error:  # noqa: BLE001  (XLA-TPU's refusal, printed as it is)
        print(f"layers {args.layers}: refused: {str(error).splitlines()[0][:300]}")
    else:
        sizes = (m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes)
        print(
            "layers {}: argument {:.2f} output {:.2f} alias {:.2f} temp {:.2f} peak {:.2f} GiB".format(  # noqa: E501
                args.layers,
                *(s / GIB for s in sizes),
                m.temp_size_in_bytes / GIB,
                m.peak_memory_in_bytes / GIB,
            )
        )
    print(f"{time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
    main()
