"""mask_embedding.pt read without torch and without running its pickle; files written by real torch."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from sparkserve.models.files import MASK_LIMIT, BadFile
from sparkserve.models.torchfile import TensorStub, TorchFileError, load, read_mask_embedding


@pytest.fixture(scope="module")
def torch() -> ModuleType:
    """Real torch, to write the files: imported by the tests that write them, not at collection (2 s of CPU in
    every pytest process that collects this module)."""
    import torch

    return torch


def test_dict_form_written_by_torch(tmp_path: Path, torch: ModuleType) -> None:
    f = tmp_path / "mask_embedding.pt"
    torch.save({"embedding": torch.zeros(6144, dtype=torch.bfloat16), "mask_token_id": 154856}, str(f))
    info = read_mask_embedding(f)
    assert (info.form, info.mask_token_id, info.embedding_shape, info.embedding_dtype) == \
        ("dict", 154856, [6144], "bfloat16")
    assert info.keys == ["embedding", "mask_token_id"] and info.embedding_numel == 6144


def test_bare_tensor_form_has_no_id(tmp_path: Path, torch: ModuleType) -> None:
    f = tmp_path / "m.pt"
    torch.save(torch.zeros(1, 256, dtype=torch.float16), str(f))
    info = read_mask_embedding(f)
    assert (info.form, info.mask_token_id, info.embedding_shape, info.embedding_dtype) == \
        ("tensor", None, [1, 256], "float16")


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_id_stored_as_a_zero_d_tensor_is_read_from_the_storage_bytes(tmp_path: Path, torch: ModuleType,
                                                                     dtype: str) -> None:
    f = tmp_path / "m.pt"
    tid = torch.tensor(151669, dtype=getattr(torch, dtype))
    torch.save({"embedding": torch.zeros(8), "mask_token_id": tid}, str(f))
    assert read_mask_embedding(f).mask_token_id == 151669


def test_a_view_into_a_larger_storage_reads_the_right_element(tmp_path: Path, torch: ModuleType) -> None:
    f = tmp_path / "m.pt"
    ids = torch.tensor([1, 2, 3, 154856], dtype=torch.int64)
    torch.save({"embedding": torch.zeros(4), "mask_token_id": ids[3]}, str(f))
    assert read_mask_embedding(f).mask_token_id == 154856


def test_dict_without_id_is_fine_and_a_parameter_is_a_tensor(tmp_path: Path, torch: ModuleType) -> None:
    f = tmp_path / "m.pt"
    torch.save({"embedding": torch.nn.Parameter(torch.zeros(16))}, str(f))
    info = read_mask_embedding(f)
    assert info.form == "dict" and info.mask_token_id is None and info.embedding_shape == [16]


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def _zip_pickle(path: Path, obj: object) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(obj, protocol=2))
    path.write_bytes(buf.getvalue())


def test_an_exploit_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    f = tmp_path / "mask_embedding.pt"
    _zip_pickle(f, {"embedding": _Exploit(marker)})
    with pytest.raises(TorchFileError, match=r"refusing pickle global posix\.system"):
        read_mask_embedding(f)
    assert not marker.exists()
    pickle.loads(pickle.dumps(_Exploit(tmp_path / "x")))  # the same payload, unpickled normally, does run
    assert (tmp_path / "x").exists()


@pytest.mark.parametrize("payload", [{"embedding": print}, {"embedding": zipfile.ZipFile}, {"embedding": set()}])
def test_any_global_outside_the_tensor_allowlist_is_refused(tmp_path: Path, payload: object) -> None:
    f = tmp_path / "m.pt"
    _zip_pickle(f, payload)
    with pytest.raises(TorchFileError):
        read_mask_embedding(f)


@pytest.mark.parametrize(("content", "needle"), [
    (b"not a zip at all", "not a torch zip archive"),
    (b"", "not a torch zip archive"),
])
def test_not_a_torch_archive(tmp_path: Path, content: bytes, needle: str) -> None:
    f = tmp_path / "m.pt"
    f.write_bytes(content)
    with pytest.raises(TorchFileError, match=needle):
        load(f)


def test_zip_without_data_pkl_and_truncated_pickle(tmp_path: Path) -> None:
    f = tmp_path / "m.pt"
    with zipfile.ZipFile(f, "w") as z:
        z.writestr("other.txt", "x")
    with pytest.raises(TorchFileError, match="no <name>/data.pkl"):
        load(f)
    with zipfile.ZipFile(f, "w") as z:
        z.writestr("a/data.pkl", pickle.dumps({"a": 1}, protocol=2)[:-3])
    with pytest.raises(TorchFileError, match="unreadable pickle"):
        load(f)


def test_wrong_shapes_are_reported(tmp_path: Path, torch: ModuleType) -> None:
    f = tmp_path / "m.pt"
    torch.save({"weights": torch.zeros(4)}, str(f))
    with pytest.raises(TorchFileError, match="no 'embedding' tensor"):
        read_mask_embedding(f)
    torch.save({"embedding": torch.zeros(4), "mask_token_id": torch.zeros(2, dtype=torch.int64)}, str(f))
    with pytest.raises(TorchFileError, match="mask_token_id is a int64 tensor of shape"):
        read_mask_embedding(f)
    torch.save([torch.zeros(4)], str(f))
    with pytest.raises(TorchFileError, match="holds a list"):
        read_mask_embedding(f)


def test_load_returns_stubs(tmp_path: Path, torch: ModuleType) -> None:
    f = tmp_path / "m.pt"
    torch.save({"a": torch.ones(2, 3, dtype=torch.float32), "n": 3}, str(f))
    obj = load(f)
    assert isinstance(obj["a"], TensorStub) and obj["a"].shape == (2, 3) and obj["a"].dtype == "float32"
    assert obj["n"] == 3


# --- hostile inputs (issue 15 item 9) ----------------------------------------------------------------------

@pytest.mark.timeout(10)
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "m.pt")
    with pytest.raises(BadFile, match="is a FIFO, not a regular file"):
        read_mask_embedding(tmp_path / "m.pt")


def test_a_file_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    f = tmp_path / "m.pt"
    with f.open("wb") as fh:
        fh.truncate(MASK_LIMIT + 1)  # sparse: no disk, and it must not be read
    with pytest.raises(BadFile, match="refusing to read more than"):
        read_mask_embedding(f)


def test_a_pickle_nested_100000_deep_is_a_torch_file_error(tmp_path: Path) -> None:
    """Unpickling is iterative, so such a pickle loads; what reads it afterwards must not recurse."""
    n = 100_000
    f = tmp_path / "m.pt"
    with zipfile.ZipFile(f, "w") as z:  # protocol 2: EMPTY_LIST n times, APPEND n-1 times, STOP
        z.writestr("a/data.pkl", b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".")
    with pytest.raises(TorchFileError, match="holds a list"):
        read_mask_embedding(f)
