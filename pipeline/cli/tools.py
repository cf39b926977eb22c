"""The commands around the stages: evaluation, YouCook II, the reports (summary, card, status, errors,
gallery, report), validate, restore, export and submit. Each is (args, cfg) -> exit code."""

from __future__ import annotations

import sys

from pipeline.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, outcomes


def run_eval(args, cfg) -> int:
    from videobert.eval import evaluate

    if args.task == "zero-shot":
        from videobert.eval import zero_shot

        zero_shot.zero_shot(cfg, args.work_dir, checkpoint=args.checkpoint, quiet=args.quiet)
    elif args.task == "linear-probe":
        from videobert.eval import probe

        probe.linear_probe(cfg, args.work_dir, quiet=args.quiet)
    elif args.task == "features":
        print(evaluate.extract_features(cfg, args.work_dir, checkpoint=args.checkpoint))
    elif args.task == "captioning":
        from videobert.eval import captioning

        captioning.run_captioning(cfg, args.work_dir, checkpoint=args.checkpoint, quiet=args.quiet)
    elif args.task == "forecast":
        from videobert.eval import forecast

        report = forecast.forecast(cfg, args.work_dir, checkpoint=args.checkpoint)
        for word in report["words"]:
            print(
                f"v{word['leaf']}: "
                + "; ".join(
                    f"+{report['horizons'][step]['label']}: "
                    + ", ".join(f"v{f['leaf']} {f['prob']:.2f}" for f in found)
                    for step, found in word["forecasts"].items()
                )
            )
        if not args.quiet:
            forecast.print_accuracy(report)
    else:
        if not args.sentence:
            print("eval predict-video: give at least one --sentence", file=sys.stderr)
            return EXIT_USAGE
        path = evaluate.predict_video(cfg, args.work_dir, args.sentence, checkpoint=args.checkpoint)
        print_predictions(path)
    return EXIT_OK


def print_predictions(path) -> None:
    """predict-video's answer: each sentence with the visual words predicted for it (their probabilities),
    then where the table is."""
    from pipeline import storage

    for row in storage.read_table(path).to_pylist():
        words = ", ".join(f"v{leaf} {prob:.2f}" for leaf, prob in zip(row["visual_ids"], row["probs"]))
        print(f"{row['sentence']!r}: {words}")
    print(f"(visual word ids are codebook leaves: `gallery --ids` shows their clips) -> {path}")


def run_youcook2_manifest(args, cfg) -> int:
    from pipeline.cli.common import confirm_removal
    from videobert.eval import youcook2

    path, table, found = youcook2.write_manifest(
        cfg,
        args.annotations,
        args.videos,
        args.work_dir,
        subsets=args.subset,
        incremental=not args.force,
        confirm_removal=confirm_removal(args),
    )
    line = (
        f"youcook2-manifest: {table.num_rows} of {found['annotated']} annotated videos in "
        f"{len(set(table['shard'].to_pylist()))} shard(s) -> {path}"
    )
    if found["missing"]:
        shown = ", ".join(found["missing"][:10]) + (" ..." if len(found["missing"]) > 10 else "")
        line += f"; {len(found['missing'])} not in {args.videos}: {shown}"
    if found.get("replaced"):
        line += f"; the outputs of the dropped videos' shards moved to {found['replaced']}"
    print(line, file=sys.stderr)
    return EXIT_OK


def run_youcook2_labels(args, cfg) -> int:
    from videobert.eval import youcook2

    out = args.out or youcook2.labels_folder(args.work_dir)
    summary = youcook2.write_labels(cfg, args.annotations, out)
    print(
        f"youcook2-labels: {len(summary['verbs'])} verbs, {len(summary['nouns'])} nouns from the "
        f"{', '.join(summary['list_subsets'])} captions, labels of {summary['segments']} segments -> {out}",
        file=sys.stderr,
    )
    for kind in ("verbs", "nouns"):
        names = list(summary[kind])
        print(f"  {kind}: {', '.join(names[:15])}{' ...' if len(names) > 15 else ''}", file=sys.stderr)
    return EXIT_OK


def run_validate(args, cfg) -> int:
    from reports import validate

    problems = validate.validate_work_dir(args.work_dir, cfg if args.config or args.set else None)
    if problems:
        print(f"INVALID: {problems[0]}", file=sys.stderr)
        for problem in problems[1:20]:
            print(f"  also: {problem}", file=sys.stderr)
        if len(problems) > 20:
            print(f"  ... and {len(problems) - 20} more", file=sys.stderr)
        return EXIT_FAILED
    outcomes["validate"] = "valid"
    print(
        f"valid: every output under {args.work_dir} matches its schema, checksums, lineage and invariants",
        file=sys.stderr,
    )
    return EXIT_OK


def run_restore(args, cfg) -> int:
    from pipeline.engine import replaced
    from pipeline.engine.workdir import WorkDir

    try:
        entry, aside, names = replaced.restore(WorkDir(args.work_dir))
    except LookupError as error:
        print(f"restore: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"restore: {len(names)} file(s) put back from {entry}"
        + (f"; what they replaced is in {aside}" if aside else ""),
        file=sys.stderr,
    )
    return EXIT_OK


def run_codebook_info(args, cfg) -> int:
    from stages.kmeans import run as kmeans

    print(kmeans.codebook_info(args.work_dir))
    return EXIT_OK


def run_summary(args, cfg) -> int:
    from reports import card, summary

    print(summary.render(summary.write_summary(args.work_dir)))
    try:  # the card stays current with the run the summary describes
        path, _ = card.write_card(args.work_dir, cfg.license)
        print(f"dataset card: {path}", file=sys.stderr)
    except card.CardError as error:
        print(f"dataset card not written: {error}", file=sys.stderr)
    return EXIT_OK


def run_card(args, cfg) -> int:
    from reports import card

    try:
        for path in card.write_card(args.work_dir, cfg.license):
            print(path)
    except card.CardError as error:
        print(f"card: {error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def run_status(args, cfg) -> int:
    from reports import status

    print(status.status_text(args.work_dir, cfg if args.config or args.set else None))
    return EXIT_OK


def run_errors(args, cfg) -> int:
    from reports import status

    print(status.errors_text(args.work_dir, args.stage))
    # a shard crashed: the run is not done (failed videos alone are reported, exit 0)
    return EXIT_FAILED if status.crashed_shards(args.work_dir, args.stage) else EXIT_OK


def run_gallery(args, cfg) -> int:
    from reports import gallery

    for path in gallery.write_gallery(
        cfg,
        args.work_dir,
        level=args.level,
        clusters=args.clusters,
        per_cluster=args.per_cluster,
        node_ids=args.ids,
        quiet=args.quiet,
    ):
        print(path)
    return EXIT_OK


def run_report(args, cfg) -> int:
    from reports import report

    print(report.write_report(cfg, args.work_dir))
    return EXIT_OK


def run_export(args, cfg) -> int:
    from videobert import export

    print(export.export(args.work_dir, args.out, args.checkpoint))
    return EXIT_OK


def run_submit(args, cfg) -> int:
    from pipeline.executors import slurm

    return slurm.submit(cfg, args)
