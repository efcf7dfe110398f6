"""Issue 38 item 9a: a FUSE prefix the GCS FUSE CSI driver cannot mount is refused when the DAG
is parsed. The driver splits a volume's ``mountOptions`` on every comma, with no escape
(GoogleCloudPlatform/gcs-fuse-csi-driver ``pkg/csi_driver/utils.go``, ``parseVolumeAttributes``),
so ``only-dir=<folder>`` of a folder whose name has a comma would mount the wrong folder."""

from __future__ import annotations

import pytest

from kinetic_airflow.job.inputs import Data


@pytest.mark.parametrize(
    ("uri", "folder"),
    [
        ("gs://kn-data/runs,2026/train/", "runs,2026/train"),
        ("gs://kn-data/a,b/labels.csv", "a,b"),  # a file: its folder is what is mounted
    ],
)
def test_a_fuse_folder_with_a_comma_is_refused_at_parse_time(uri, folder):
    with pytest.raises(ValueError) as caught:
        Data(uri, fuse=True)
    message = str(caught.value)
    assert f"Data({uri!r}, fuse=True)" in message
    assert f"folder {folder!r} has a comma" in message
    assert "splits its mount options on every comma" in message
    assert "drop fuse=True" in message and "without a comma" in message


def test_commas_the_driver_never_sees_are_fine():
    Data("gs://kn-data/train/part,1.csv", fuse=True)  # the file name is not in only-dir
    Data("gs://kn-data/runs,2026/", fuse=False)  # copied, not mounted
