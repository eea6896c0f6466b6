# Sourced by bench/compare and bench/instr-count: the peer allocators, their Debian packages,
# and where their shared objects are found. Defines PEERS, peer_package and find_peer.
PEERS=(jemalloc tcmalloc mimalloc)

peer_package() {
  case $1 in
    jemalloc) echo libjemalloc2 ;;
    tcmalloc) echo libtcmalloc-minimal4 ;;
    mimalloc) echo libmimalloc2.0 ;;
  esac
}

# Prints the path of the peer's shared object, or nothing when it is not installed;
# $FASTMALLOC_PEERS_DIR, when set, is searched first.
find_peer() {
  local so dir
  case $1 in
    jemalloc) so=libjemalloc.so.2 ;;
    tcmalloc) so=libtcmalloc_minimal.so.4 ;;
    mimalloc) so=libmimalloc.so.2 ;;
  esac
  for dir in ${FASTMALLOC_PEERS_DIR:+"$FASTMALLOC_PEERS_DIR"} /usr/lib/x86_64-linux-gnu \
             /lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib /usr/lib; do
    if [ -e "$dir/$so" ]; then
      echo "$dir/$so"
      return
    fi
  done
}
