#!/bin/bash
# Stage 2 (on the host's root): a minimal boot, the crafted PCI tree, the
# scenario, then its exit status to the run share and power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C.UTF-8 TERM=dumb VM_FILES=/run/vm/files

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# /tmp stays the overlay's: a checkout or kit cache under the host's /tmp (CI clones there)
# must be visible in the guest.
hostname vm

# One directory per PCI device, the real ones copied and the fake GPUs added,
# bind-mounted where the installer and nvidia.ko look for devices.
craft_pci_tree() {
    local tree=/run/vm-pci dev attr
    mkdir -p "$tree"
    for dev in /sys/bus/pci/devices/*; do
        mkdir "$tree/${dev##*/}"
        for attr in vendor device class subsystem_vendor subsystem_device irq; do
            cat "$dev/$attr" > "$tree/${dev##*/}/$attr"
        done
    done
    while read -r address vendor device class subsystem_vendor subsystem_device; do
        rm -rf "${tree:?}/$address"
        mkdir "$tree/$address"
        echo "$vendor" > "$tree/$address/vendor"
        echo "$device" > "$tree/$address/device"
        echo "$class" > "$tree/$address/class"
        echo "$subsystem_vendor" > "$tree/$address/subsystem_vendor"
        echo "$subsystem_device" > "$tree/$address/subsystem_device"
        echo 0 > "$tree/$address/irq"
    done < /run/vm/gpus
    mount --bind "$tree" /sys/bus/pci/devices
}

# The guest's /lib/modules/<k>: the small tree tests/vm/module_tree.py made (this machine's
# full one costs each depmod about a minute under TCG), copied once into the root filesystem
# (onto the state disk when there is one, so installed modules survive a reboot).
use_module_tree() {
    local kept=/var/lib/vm-modules/$(uname -r)
    if [ ! -d "$kept" ]; then
        mkdir -p "${kept%/*}"
        cp -a "$(cat /run/vm/module-tree)" "$kept.partial" && mv "$kept.partial" "$kept"
    fi
    mount --bind "$kept" "/lib/modules/$(uname -r)"
}

[ -f /run/vm/module-tree ] && use_module_tree
[ -f /run/vm/gpus ] && craft_pci_tree

echo "vm: scenario starts"
cd /root 2>/dev/null || cd /
bash -e /run/vm/scenario.sh < /dev/null
status=$?
echo "$status" > /run/vm/exit_code
echo "vm: scenario exit code $status"
sync
echo o > /proc/sysrq-trigger
sleep 60
