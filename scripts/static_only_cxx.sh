#!/usr/bin/env bash
# A C++ compiler whose libstdc++ exists only as a static archive, made from this machine's own:
# what the lent GPU host's GCC 13 at /opt/gcc is (docs/gpu.md). Prints the compiler's path.
#   CXX=$(bash scripts/static_only_cxx.sh DIR) cmake ...
# DIR gets libstdc++.a (a link to the real compiler's) and a `c++` that runs the real compiler
# with -B DIR/: the driver searches DIR first, finds only the archive there, and links it where
# it would have linked libstdc++.so; headers, crt files and the rest come from the real one.
set -euo pipefail
DIR=${1:?usage: static_only_cxx.sh DIR}
REAL=${DDPL_REAL_CXX:-$(command -v g++)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
archive=$("$REAL" -print-file-name=libstdc++.a)
[ -f "$archive" ] || { echo "static_only_cxx: $REAL has no libstdc++.a" >&2; exit 1; }
ln -sfn "$archive" "$DIR/libstdc++.a"
cat > "$DIR/c++.new" <<WRAP
#!/bin/sh
exec "$REAL" -B "$DIR/" "\$@"
WRAP
chmod 755 "$DIR/c++.new"
mv -f "$DIR/c++.new" "$DIR/c++"
echo "$DIR/c++"
