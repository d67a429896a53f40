"""The line operators copy into their inventories, kept: `from ascend_fleet.fleet_check import
check_before_connecting`. The check lives in fleet/check.py."""

from ascend_fleet.fleet.check import check_before_connecting

__all__ = ["check_before_connecting"]
