"""topo/results.py: the Markdown table and the figure of a study run."""
import json

from topo.results import figure, table, write_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def summary() -> dict:
    return {
        "bottleneck_mbps": 5,
        "policies": {
            "none": {"steps": [
                {"udp_mbps_offered": 0, "tcp_mbps": 4.8123, "udp_mbps_delivered": 0.0},
                {"udp_mbps_offered": 2.5, "tcp_mbps": 2.5, "udp_mbps_delivered": 2.4949},
                {"udp_mbps_offered": 12, "tcp_mbps": None, "udp_mbps_delivered": 4.7},
            ]},
            "reserve": {"tcp_reservation_mbps": 4.0, "steps": [
                {"udp_mbps_offered": 0, "tcp_mbps": 4.79, "udp_mbps_delivered": 0.0},
                {"udp_mbps_offered": 2.5, "tcp_mbps": 4.1, "udp_mbps_delivered": 0.896},
                {"udp_mbps_offered": 12, "tcp_mbps": 4.004, "udp_mbps_delivered": None},
            ]},
        },
    }


def test_table_has_a_header_and_one_row_per_step():
    assert table(summary()).splitlines() == [
        "| UDP offered (Mbit/s) | none: TCP | none: UDP delivered | reserve: TCP | reserve: UDP delivered |",
        "|---:|---:|---:|---:|---:|",
        "| 0 | 4.81 | 0.00 | 4.79 | 0.00 |",
        "| 2.5 | 2.50 | 2.49 | 4.10 | 0.90 |",
        "| 12 | – | 4.70 | 4.00 | – |",
    ]


def test_table_ends_with_a_newline_and_every_row_has_the_header_columns():
    text = table(summary())
    assert text.endswith("|\n")
    lines = text.splitlines()
    assert {line.count("|") for line in lines} == {6}


def test_table_of_one_policy():
    one = {"bottleneck_mbps": 5, "policies": {"auto": summary()["policies"]["reserve"]}}
    assert table(one).splitlines()[0] == "| UDP offered (Mbit/s) | auto: TCP | auto: UDP delivered |"
    assert len(table(one).splitlines()) == 2 + 3


def test_figure_writes_a_png(tmp_path):
    path = tmp_path / "figure2.png"
    figure(summary(), path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 5000


def test_write_json_round_trips(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, summary())
    assert json.loads(path.read_text()) == summary()
    assert path.read_text().endswith("\n")
