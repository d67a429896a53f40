"""The simulated Ascend platform: what needs the hardware or Huawei's binaries, and the lab's own model."""
