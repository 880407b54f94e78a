#!/bin/sh
# Installs gpureap from its release artifacts (docs/install.md):
#
#   sh install.sh [--from DIR|URL] [--prefix DIR]
#
# --from: a folder or an http(s) URL holding SHA256SUMS and the tarballs
#         gpureap-VERSION-ARCH-linux.tar.gz (scripts/release's dist/); by default the folder
#         this script is in, when it holds a SHA256SUMS.
# --prefix: where to install (default /usr/local): PREFIX/bin/gpureap, the man pages in
#         PREFIX/share/man/man1, the bash, zsh and fish completions under PREFIX/share, the
#         README and licences in PREFIX/share/doc/gpureap.
#
# Picks the tarball of this machine's architecture (uname -m: x86_64 or aarch64), checks its
# SHA-256 against SHA256SUMS, and refuses, installing nothing, on a mismatch, an architecture
# with no build, or a C library that is not glibc 2.17 or newer. Needs sh, tar, gzip,
# sha256sum (or shasum), and curl or wget for a URL.
set -eu

prefix=/usr/local
from=

fail() {
    echo "install.sh: $*" >&2
    exit 1
}

usage() {
    echo "usage: sh install.sh [--from DIR|URL] [--prefix DIR]"
}

while [ $# -gt 0 ]; do
    case $1 in
    --from | --prefix)
        [ $# -ge 2 ] || {
            echo "install.sh: $1 needs a value" >&2
            usage >&2
            exit 2
        }
        if [ "$1" = --from ]; then from=$2; else prefix=$2; fi
        shift 2
        ;;
    --from=*) from=${1#--from=} && shift ;;
    --prefix=*) prefix=${1#--prefix=} && shift ;;
    -h | --help) usage && exit 0 ;;
    *)
        echo "install.sh: unknown argument '$1'" >&2
        usage >&2
        exit 2
        ;;
    esac
done

if [ -z "$from" ]; then
    here=$(cd "$(dirname "$0")" && pwd)
    [ -f "$here/SHA256SUMS" ] ||
        fail "say where the release is: --from DIR or --from URL (the folder that holds SHA256SUMS and gpureap-VERSION-ARCH-linux.tar.gz)"
    from=$here
fi
from=${from%/}

machine=$(uname -m)
case $machine in
x86_64 | amd64) arch=x86_64 ;;
aarch64 | arm64) arch=aarch64 ;;
*) fail "no gpureap build for this machine's architecture '$machine' (there are x86_64 and aarch64); nothing installed" ;;
esac

# The C library: glibc 2.17 or newer (what the binaries are linked against).
if command -v ldd >/dev/null 2>&1; then
    libc=$(ldd --version 2>&1 | head -n 1) || true
elif command -v getconf >/dev/null 2>&1; then
    libc=$(getconf GNU_LIBC_VERSION 2>/dev/null) || true
else
    libc=
fi
case $libc in
*musl*) fail "this machine's C library is musl ($libc); gpureap's builds need glibc 2.17 or newer; nothing installed" ;;
esac
glibc=${libc##* }
major=${glibc%%.*}
minor=${glibc#*.}
minor=${minor%%[!0-9]*}
case $major$minor in
'' | *[!0-9]*) fail "cannot tell this machine's glibc version (ldd --version said '$libc'); gpureap needs glibc 2.17 or newer; nothing installed" ;;
esac
if [ "$major" -lt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -lt 17 ]; }; then
    fail "this machine has glibc $glibc; gpureap needs glibc 2.17 or newer; nothing installed"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gpureap-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# fetch NAME: the release's file NAME into the work folder.
fetch() {
    case $from in
    http://* | https://*)
        if command -v curl >/dev/null 2>&1; then
            curl -fsSL -o "$work/$1" "$from/$1" || fail "could not download $from/$1"
        elif command -v wget >/dev/null 2>&1; then
            wget -q -O "$work/$1" "$from/$1" || fail "could not download $from/$1"
        else
            fail "needs curl or wget to download from $from"
        fi
        ;;
    *)
        [ -f "$from/$1" ] || fail "$from/$1: no such file"
        cp "$from/$1" "$work/$1"
        ;;
    esac
}

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -c1-64
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -c1-64
    else
        fail "needs sha256sum or shasum to check the download"
    fi
}

fetch SHA256SUMS
line=$(grep -E "^[0-9a-f]{64}  gpureap-[0-9A-Za-z.+~-]+-$arch-linux\.tar\.gz\$" "$work/SHA256SUMS" | tail -n 1) || true
[ -n "$line" ] || fail "$from/SHA256SUMS lists no gpureap-VERSION-$arch-linux.tar.gz; nothing installed"
name=${line#*  }
expected=${line%%  *}
fetch "$name"
actual=$(sha256 "$work/$name")
[ "$actual" = "$expected" ] ||
    fail "checksum mismatch: $name has SHA-256 $actual, SHA256SUMS says $expected; nothing installed"

tar -xzf "$work/$name" -C "$work"
unpacked=$work/${name%.tar.gz}
[ -f "$unpacked/gpureap" ] || fail "$name holds no gpureap binary"
version=$("$unpacked/gpureap" --version) || fail "$name's gpureap does not run here; nothing installed"

# put FILE DIR NAME MODE: FILE as DIR/NAME, replaced whole (a running gpureap keeps its old file).
put() {
    mkdir -p "$2"
    cp "$1" "$2/.$3.new"
    chmod "$4" "$2/.$3.new"
    mv -f "$2/.$3.new" "$2/$3"
}

put "$unpacked/gpureap" "$prefix/bin" gpureap 755
for page in "$unpacked"/man/*.1; do
    put "$page" "$prefix/share/man/man1" "${page##*/}" 644
done
put "$unpacked/completions/gpureap.bash" "$prefix/share/bash-completion/completions" gpureap 644
put "$unpacked/completions/_gpureap" "$prefix/share/zsh/site-functions" _gpureap 644
put "$unpacked/completions/gpureap.fish" "$prefix/share/fish/vendor_completions.d" gpureap.fish 644
for doc in README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE; do
    put "$unpacked/$doc" "$prefix/share/doc/gpureap" "$doc" 644
done

echo "installed $version ($arch) as $prefix/bin/gpureap, checksum verified"
case :${PATH:-}: in
*:"$prefix/bin":*) ;;
*) echo "$prefix/bin is not on PATH: add it, or call $prefix/bin/gpureap" ;;
esac
