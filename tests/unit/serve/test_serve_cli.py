"""``kiln serve``'s command line: bad arguments are user errors (exit status 2) before any
model is fetched or compiled."""

from __future__ import annotations

import pytest

from kiln.cli.main import main


@pytest.mark.parametrize("argv, message", [
    (["serve", "no-such-model.onnx"], "no such file"),
    (["serve", "smollm2", "--max-batch", "65"], "1..64"),
])
def test_serve_user_errors_exit_2(argv, message, capsys, tmp_path):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_serve_refuses_a_file_that_is_not_a_decoder(tmp_path, capsys):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    assert main(["serve", str(path)]) == 2
    assert "expected an ONNX decoder" in capsys.readouterr().err


def test_serve_queue_must_not_be_negative(capsys):
    with pytest.raises(SystemExit) as err:
        main(["serve", "smollm2", "--queue", "-1"])
    assert err.value.code == 2
