"""With ``data.skip_bad_records`` and ``tensor`` across hosts, hosts that read the same rows feed one batch shard: if
their copies of the dataset differ they skip different records and the shard silently gets different examples on
different hosts. The loop compares their skip counts at every log step and before every save, and stops in one
line. Which hosts read the same rows: tests/test_pod_topology.py
(``test_tensor_across_hosts_makes_those_hosts_read_the_same_rows``)."""
import pytest

from layerscale_jax.errors import UserError
from layerscale_jax.train import feed as feed_lib
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.feed import replica_mismatch
from layerscale_jax.train.config import validate_experiment_config

from test_train import tiny_config


def test_replicas_that_skipped_different_records_are_named():
    plan = {0: ((0, 8),), 1: ((0, 8),), 2: ((8, 16),), 3: ((8, 16),)}      # tensor=2 across hosts
    assert replica_mismatch(plan, [1, 1, 0, 0]) is None
    assert replica_mismatch(plan, [1, 1, 0, 2]) == ("processes that read the same rows skipped different numbers of "
                                                    "bad records (process 2: 0, process 3: 2)")
    assert replica_mismatch({0: ((0, 8),), 1: ((8, 16),)}, [0, 5]) is None    # different rows: independent


@pytest.mark.slow
def test_the_loop_stops_when_hosts_reading_the_same_rows_skipped_different_records(tmp_path, monkeypatch):
    """Two processes simulated in one: their plans name the same rows and their gathered counts differ."""
    monkeypatch.setattr(feed_lib, "read_plan", lambda *a: {0: ((0, 16),), 1: ((0, 16),)})
    monkeypatch.setattr(feed_lib, "gather_from_all", lambda count: [count, count + 1])
    config = tiny_config("steps=4")
    config.data.skip_bad_records = True
    with pytest.raises(UserError, match=r"by step 1, processes that read the same rows skipped different numbers of "
                                         r"bad records \(process 0: 0, process 1: 1\): their copies of the dataset "
                                         r"differ"):
        loop_lib.train_and_evaluate(validate_experiment_config(config), str(tmp_path / "run"))
