"""Report tables read the saved Parquet layout and present it in a fixed order."""

from __future__ import annotations

import pandas as pd

from lmclab.report import endpoint_table


def test_endpoint_table_lists_each_seed_once_in_seed_order_with_its_last_epoch() -> None:
    rows = [{"seed": s, "epoch": e, "train_loss": 1.0 / e, "test_loss": 2.0 / e, "test_acc": 0.5 + e / 100}
            for s in (2, 0, 3, 1) for e in (3, 1, 2)]
    lines = endpoint_table(pd.DataFrame(rows)).splitlines()[2:]
    assert [line.split("|")[1].strip() for line in lines] == ["0", "1", "2", "3"]
    assert all(line.split("|")[2].strip() == "3" for line in lines)
    assert lines[0].split("|")[5].strip() == "53.00"
