"""Prepare a TFDS dataset as array_record so the pipeline can read it without TensorFlow.

    python -m layerscale_jax.data.prepare --name=cifar10 --data_dir=~/tensorflow_datasets
    python -m layerscale_jax.data.prepare --name=imagenet2012 --data_dir=DIR --manual_dir=DIR/downloads/manual

This imports TensorFlow (TFDS needs it to write datasets); training processes never do. `digits` is prepared by
this command automatically on first use. (`tfds build` would also work where apache_beam is installed, with
`--file_format=array_record`.)

An unknown dataset name (with the closest TFDS names), a data dir that cannot be written, or missing manual files are
reported in one line, `error: ...`, with exit status 2; `--debug` adds the traceback.
"""

import argparse
import os
import sys


def prepare(name, data_dir, manual_dir=None):
    from layerscale_jax.data import sources

    data_dir = sources.resolve_data_dir(data_dir)
    import tensorflow_datasets as tfds

    builder = sources.tfds_builder(name, data_dir)
    config = tfds.download.DownloadConfig(manual_dir=os.path.expanduser(manual_dir) if manual_dir else None)
    builder.download_and_prepare(file_format="array_record", download_config=config)
    return builder


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m layerscale_jax.data.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="'digits' or a TFDS dataset name")
    parser.add_argument(
        "--data_dir", default=None, help="TFDS data dir (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)"
    )
    parser.add_argument("--manual_dir", default=None, help="where manually downloaded files are (imagenet2012)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error as well "
                                                             "(or set LAYERSCALE_JAX_DEBUG=1)")
    args = parser.parse_args(argv)
    if args.manual_dir and not os.path.isdir(os.path.expanduser(args.manual_dir)):
        raise FileNotFoundError(f"--manual_dir {args.manual_dir!r} is not a directory")
    builder = prepare(args.name, args.data_dir, args.manual_dir)
    sizes = {k: v.num_examples for k, v in builder.info.splits.items()}
    print(f"prepared {args.name} in {builder.data_dir}: {sizes}")
    return 0


if __name__ == "__main__":
    from layerscale_jax.cli import run_cli

    sys.exit(run_cli(main))
