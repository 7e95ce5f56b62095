"""Prepare a TFDS dataset as array_record so the pipeline can read it without TensorFlow.

    python -m layerscale_jax.data.prepare --name=cifar10 --data_dir=~/tensorflow_datasets
    python -m layerscale_jax.data.prepare --name=imagenet2012 --data_dir=DIR --manual_dir=DIR/downloads/manual

This imports TensorFlow (TFDS needs it to write datasets); training processes never do. `digits` is prepared by
this command automatically on first use. (`tfds build` would also work where apache_beam is installed, with
`--file_format=array_record`.)

An unknown dataset name (with the closest TFDS names), a data dir that cannot be written, missing manual files, or a
download host that cannot be reached are reported in one line, `error: ...`, with exit status 2; `--debug` adds the
traceback. The hosts are tried (one connection each, `CONNECT_TIMEOUT_S`) before TFDS starts: TFDS's downloader
retries every file ten times with exponential back-off, which takes about 3.5 minutes to give up when offline.
"""

import argparse
import os
import socket
import sys
import urllib.parse
import urllib.request

from layerscale_jax.errors import UserError

CONNECT_TIMEOUT_S = 10


def download_hosts(builder):
    """``(host, port)`` of every URL the builder downloads from (TFDS's recorded URL checksums); none for a dataset
    built from manually downloaded files, whose URLs only name those files."""
    if getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None):
        return []
    hosts = set()
    for url in getattr(builder, "url_infos", None) or {}:
        parts = urllib.parse.urlsplit(url)
        if parts.hostname:
            hosts.add((parts.hostname, parts.port or {"http": 80, "ftp": 21}.get(parts.scheme, 443)))
    return sorted(hosts)


def check_reachable(name, hosts, timeout=CONNECT_TIMEOUT_S):
    """Open one TCP connection to each download host (or to the proxy that serves it, from ``HTTPS_PROXY`` etc.);
    ``UserError`` naming the host and the cause when one cannot be reached."""
    proxies = urllib.request.getproxies()
    for host, port in hosts:
        scheme = "http" if port == 80 else "https"
        proxy = proxies.get(scheme) if not urllib.request.proxy_bypass(host) else None
        target = host, port
        if proxy:
            parsed = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            target = parsed.hostname, parsed.port or 80
        try:
            socket.create_connection(target, timeout=timeout).close()
        except OSError as err:
            via = f" through the proxy {target[0]}:{target[1]}" if proxy else ""
            cause = err.strerror or str(err) or type(err).__name__
            raise UserError(f"cannot download {name!r}: {host}:{port} cannot be reached{via} ({cause}); check the "
                            "network (or HTTPS_PROXY), or prepare the dataset on a machine that has one and copy "
                            "its data dir here") from err


def prepare(name, data_dir, manual_dir=None):
    from layerscale_jax.data import sources

    data_dir = sources.resolve_data_dir(data_dir)
    import tensorflow_datasets as tfds

    builder = sources.tfds_builder(name, data_dir)
    if not builder.is_prepared():
        check_reachable(name, download_hosts(builder))
    # GCS hosts prepared TFDS datasets as TFRecord only: nothing there for array_record, so do not ask.
    config = tfds.download.DownloadConfig(manual_dir=os.path.expanduser(manual_dir) if manual_dir else None,
                                          try_download_gcs=False)
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
