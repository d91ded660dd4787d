#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
/bin/busybox mount -t tmpfs -o size=300m tmpfs /t
/bin/busybox dd if=/dev/urandom of=/t/fill bs=1M count=100 2>/dev/null
echo FILL_DONE > /dev/ttyS0
echo FILL_DONE
i=0
while true; do
  /bin/busybox dd if=/dev/urandom of=/t/w bs=1M count=1 2>/dev/null
  i=$((i+1))
  echo "tick $i" > /dev/ttyS0
  /bin/busybox sleep 1
done
