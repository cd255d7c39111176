"""A team's plain storage code, as a script: write and read back one object under a gs:// prefix with one client
library, given nothing but the environment (no tpuflow import, no endpoint or credentials in the code).

    python plain_gcs_clients.py pyarrow|gcsfs|google-cloud-storage gs://BUCKET/PREFIX

Prints one JSON line: the library, what it read back and the object it wrote. The tests run it in a subprocess
with a timeout: a client that looks for credentials it cannot find hangs rather than fails.
"""

from __future__ import annotations

import json
import sys


def with_pyarrow(prefix: str) -> tuple[object, str]:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    uri = f"{prefix}/table.parquet"
    pq.write_table(pa.table({"n": [1, 2, 3]}), uri)
    fs, path = pafs.FileSystem.from_uri(uri)
    assert fs.get_file_info(path).size > 0
    return pq.read_table(uri).to_pydict(), uri


def with_gcsfs(prefix: str) -> tuple[object, str]:
    import gcsfs

    uri = f"{prefix}/gcsfs.txt"
    fs = gcsfs.GCSFileSystem()
    with fs.open(uri, "wb") as out:
        out.write(b"written by gcsfs")
    return fs.cat(uri).decode(), uri


def with_google_cloud_storage(prefix: str) -> tuple[object, str]:
    from google.cloud import storage

    bucket, _, folder = prefix.removeprefix("gs://").partition("/")
    blob = storage.Client().bucket(bucket).blob(f"{folder}/client.txt")
    blob.upload_from_string("written by google-cloud-storage")
    return blob.download_as_text(), f"gs://{bucket}/{blob.name}"


LIBRARIES = {"pyarrow": with_pyarrow, "gcsfs": with_gcsfs, "google-cloud-storage": with_google_cloud_storage}


if __name__ == "__main__":
    library, prefix = sys.argv[1], sys.argv[2].rstrip("/")
    read, uri = LIBRARIES[library](prefix)
    print(json.dumps({"library": library, "read": read, "uri": uri}))
