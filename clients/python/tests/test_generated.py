"""The committed generated code is what bin/protobufs makes from protocol/fanout.proto."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "clients/python/src/fanout_client/_proto"


def test_generated_code_is_up_to_date(tmp_path):
    subprocess.run([str(ROOT / "bin/protobufs"), "--python-out", str(tmp_path)], check=True, cwd=ROOT)
    for name in ("fanout_pb2.py", "fanout_pb2.pyi"):
        assert (tmp_path / name).read_text() == (PROTO_DIR / name).read_text(), (
            f"{name} is stale: run bin/protobufs and commit clients/python/src/fanout_client/_proto"
        )
