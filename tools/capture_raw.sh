#!/usr/bin/env bash
# Record raw machine data (ground truth) for fixtures. Runs as root on a GPU machine; writes under $1.
set -u
o=${1:?outdir}; mkdir -p "$o"
{
  echo "== uname"; uname -a
  echo "== os-release"; cat /etc/os-release
  echo "== python"; python3 --version; python3 -c 'import pynvml,sys;print(pynvml.__file__)'
  python3 -m pip list 2>/dev/null | grep -Ei 'nvidia-ml|pynvml|click|yaml|jinja|psutil|rich|paramiko|pytest|hypothesis'
  echo "== proc/devices"; cat /proc/devices
  echo "== ls dev nvidia"; ls -la /dev/nvidia* /dev/nvidia-caps 2>&1
  echo "== stat"; stat -c '%n %F %t:%T %a' /dev/nvidia* 2>&1
  echo "== driver version"; cat /proc/driver/nvidia/version 2>&1
  echo "== sysctl"; cat /proc/sys/kernel/numa_balancing 2>&1
  echo "== cmdline"; cat /proc/cmdline
  echo "== shm"; df -B1 /dev/shm; mount | grep -E 'shm|cgroup'
  echo "== cgroup"; cat /proc/self/cgroup; ls /sys/fs/cgroup | head -50
  for f in memory.max memory.current cpuset.cpus.effective cpuset.mems.effective; do echo "$f: $(cat /sys/fs/cgroup/$f 2>&1)"; done
  echo "== container"; cat /proc/1/environ 2>/dev/null | tr '\0' '\n' | grep -i container; ls -la /run/.containerenv /.dockerenv 2>&1; systemd-detect-virt 2>&1; cat /proc/1/comm
  echo "== lspci"; which lspci setpci; lspci -nn 2>&1 | head -40
  echo "== sysfs gpus"
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat $d/vendor)" = 0x10de ] || continue
    echo "$d class=$(cat $d/class) numa=$(cat $d/numa_node) cpulist=$(cat $d/local_cpulist) cfgsize=$(stat -c %s $d/config)"
    echo "  link cur=$(cat $d/current_link_speed) w=$(cat $d/current_link_width) max=$(cat $d/max_link_speed) mw=$(cat $d/max_link_width)"
    b=$(basename $d); cp $d/config "$o/pcicfg_$b.bin" 2>&1
  done
  echo "== nproc"; nproc; lscpu | head -30
  echo "== nvidia-smi"; nvidia-smi; nvidia-smi topo -m; nvidia-smi topo -p2p r; nvidia-smi topo -p2p w
  nvidia-smi --query-gpu=index,name,pci.bus_id,uuid,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,persistence_mode,ecc.mode.current --format=csv
} > "$o/raw.txt" 2>&1
nvidia-smi -q -x > "$o/nvidia-smi-q.xml" 2>&1
# timings for the benchmark floor
{ echo "== time nvidia-smi -q"; for i in 1 2 3; do /usr/bin/time -f %e nvidia-smi -q >/dev/null; done
  echo "== time cuInit"; for i in 1 2 3; do /usr/bin/time -f %e python3 -c 'import ctypes;l=ctypes.CDLL("libcuda.so.1");print(l.cuInit(0))'; done
} > "$o/timing.txt" 2>&1
