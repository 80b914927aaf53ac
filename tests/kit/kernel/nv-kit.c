/*
 * nvidia.ko as one translation unit. kbuild runs gcc once per object, and each run parses the
 * kernel's headers again: one run instead of seven halves the kit's build (7.0 s -> 3.4 s with
 * make -j1 on the host; the vm tier compiles it under TCG emulation, ~35x slower). The files
 * below stay separate for reading; each is also valid on its own.
 */
#include "nv-main.c"
#include "nv-pci-scan.c"
#include "nv-gpu-table.c"
#include "nv-procfs.c"
#include "nv-chrdev.c"
#include "nv-gpu-state.c"
#include "nv-nvswitch.c"
