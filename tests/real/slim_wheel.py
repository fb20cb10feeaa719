"""Repack a wheel without members a serve run on the device never opens, so fewer parts travel (issue 43).

usage: python3 tests/real/slim_wheel.py WHEEL GLOB [GLOB ...]   (rewrites WHEEL in place; prints the MiB saved)

The RECORD lines of the dropped members go too, so `pip install` sees a consistent wheel. What is dropped is
named by the caller (scripts/real-engine's VSLIM), each with the reason it is never loaded there.
"""
import fnmatch
import os
import sys
import zipfile


def main() -> None:
    whl, globs = sys.argv[1], sys.argv[2:]
    tmp = whl + ".slim"
    before = os.path.getsize(whl)
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        drop = {i.filename for i in src.infolist() if any(fnmatch.fnmatch(i.filename, g) for g in globs)}
        for info in src.infolist():
            if info.filename in drop:
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(ln for ln in data.splitlines(keepends=True)
                                if ln.split(b",", 1)[0].decode() not in drop)
            dst.writestr(info, data, compress_type=info.compress_type)
    os.replace(tmp, whl)
    print(f"{os.path.basename(whl)}: {len(drop)} members dropped, "
          f"{(before - os.path.getsize(whl)) / 2**20:.1f} MiB saved")


if __name__ == "__main__":
    main()
