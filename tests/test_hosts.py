"""hardware=cpu without a host count: the root Config takes the smallest the run needs; valid
da splits print as a user types them."""

import pytest

from locoexp.config import Config
from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError
from locoexp.hardware.config import HardwareConfig
from locoexp.layout import PlacementKind, show_splits
from locoexp.placement.config import PlacementConfig

DA = PlacementConfig(kind=PlacementKind.da)


@pytest.mark.parametrize(
    ("split", "hosts"), [(0.5, 2), (0.25, 4), (0.75, 4), (0.125, 8), (0.333, 3)]
)
def test_da_takes_the_smallest_host_count_its_split_needs(split, hosts):
    config = Config(placement=DA, split=split, dataset=_dataset(hosts))
    assert config.hosts == hosts and config.hardware.hosts is None  # resolved, not written back


def test_colocated_takes_one_host_and_a_given_count_is_kept():
    assert Config().hosts == 1 and Config().hardware.hosts is None
    given = Config(hardware=HardwareConfig(hosts=2))
    assert given.hosts == 2 and given.hardware.hosts == 2


def test_valid_splits_print_rounded_and_refusals_list_them():
    assert show_splits(3) == "0.333, 0.667"
    assert show_splits(16).startswith("0.062, 0.125, 0.188, 0.25")
    with pytest.raises(ConfigError, match=r"valid splits for 3 hosts: 0\.333, 0\.667\.$"):
        Config(placement=DA, split=0.4, hardware=HardwareConfig(hosts=3))


def _dataset(hosts: int) -> DatasetConfig:
    return DatasetConfig(prompts_per_step=840)  # divisible by every host count up to 8


def test_chip_and_device_counts_are_read_from_the_resolved_hardware_only():
    with pytest.raises(ValueError, match="read Config.resolved_hardware"):
        _ = HardwareConfig().chips  # hardware=cpu, hosts: null (was None * 1, a TypeError)
    assert Config().resolved_hardware.devices == 1
