package oci

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Rootfs collects files from this machine's installed Debian packages
// into an image's file system: each package's files as dpkg lists them,
// and every shared library their programs load (ldd's answer), links and
// all. No registry is reachable here, so the images the cluster runs
// beside the project's own (Squid, Redis, curl) are made from the same
// packages the loopback suites run.
type Rootfs struct {
	files map[string]File
	order []string
}

// NewRootfs starts with the merged-/usr links Debian's programs expect
// (/lib64/ld-linux-x86-64.so.2 is every dynamic binary's interpreter).
func NewRootfs() *Rootfs {
	r := &Rootfs{files: map[string]File{}}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if target, err := os.Readlink(d); err == nil {
			r.put(File{Path: d, Link: target})
		}
	}
	return r
}

// skipped are the parts of a package no container runs.
var skipped = []string{
	"/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/lintian/",
	"/usr/share/bug/", "/etc/init.d/", "/etc/logrotate.d/", "/lib/systemd/",
	"/usr/lib/systemd/", "/etc/apparmor.d/", "/usr/share/apport/", "/etc/default/",
	"/usr/lib/tmpfiles.d/", "/etc/ufw/", "/usr/share/sysctl.d/",
}

// Packages adds every file of the installed packages pkgs.
func (r *Rootfs) Packages(pkgs ...string) error {
	for _, pkg := range pkgs {
		out, err := exec.Command("dpkg", "-L", pkg).Output()
		if err != nil {
			return fmt.Errorf("dpkg -L %s: %w (is the package installed? make deps installs it)", pkg, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			p := sc.Text()
			if !strings.HasPrefix(p, "/") || skip(p) {
				continue
			}
			st, err := os.Lstat(p)
			if err != nil || st.IsDir() {
				continue // a conffile the admin removed, or a directory (made as parents)
			}
			if err := r.Add(p); err != nil {
				return fmt.Errorf("package %s: %w", pkg, err)
			}
		}
	}
	return nil
}

func skip(p string) bool {
	for _, s := range skipped {
		if strings.HasPrefix(p, s) {
			return true
		}
	}
	return false
}

// Add adds the host file p at its own path: a link as a link and its
// target too, an ELF program with the libraries it loads.
func (r *Rootfs) Add(p string) error {
	canon, err := canonical(p)
	if err != nil {
		return err
	}
	if _, ok := r.files[canon]; ok {
		return nil
	}
	st, err := os.Lstat(canon)
	if err != nil {
		return err
	}
	switch {
	case st.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(canon)
		if err != nil {
			return err
		}
		r.put(File{Path: canon, Link: target})
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(canon), target)
		}
		if _, err := os.Stat(target); err != nil {
			return nil // a dangling link stays dangling
		}
		return r.Add(target)
	case st.Mode().IsRegular():
		r.put(File{Path: canon, Source: canon, Mode: int64(st.Mode().Perm())})
		libs, err := libraries(canon)
		if err != nil {
			return err
		}
		for _, l := range libs {
			if err := r.Add(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// Put adds a file of the image's own (a config, a script, an account).
func (r *Rootfs) Put(f File) { r.put(f) }

func (r *Rootfs) put(f File) {
	if _, ok := r.files[f.Path]; !ok {
		r.order = append(r.order, f.Path)
	}
	r.files[f.Path] = f
}

// Files are the collected files.
func (r *Rootfs) Files() []File {
	out := make([]File, 0, len(r.order))
	for _, p := range r.order {
		out = append(out, r.files[p])
	}
	return out
}

// canonical resolves the links of p's directories (/lib/x → /usr/lib/x),
// so a file is stored once, under the real directory the image's links
// lead to.
func canonical(p string) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(p)), nil
}

// libraries are the shared objects a dynamic ELF file loads, by ldd.
func libraries(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, nil // not ELF
	}
	defer f.Close()
	if f.Section(".interp") == nil && f.Section(".dynamic") == nil {
		return nil, nil // static
	}
	out, err := exec.Command("ldd", p).Output()
	if err != nil {
		return nil, nil // ldd refuses some objects (static PIE, plugins): nothing to follow
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 3 && fields[1] == "=>" && strings.HasPrefix(fields[2], "/"):
			libs = append(libs, fields[2])
		case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
			libs = append(libs, fields[0]) // the interpreter
		case len(fields) >= 2 && fields[1] == "=>" && fields[2] == "not":
			return nil, fmt.Errorf("%s: library %s not found", p, fields[0])
		}
	}
	return libs, nil
}

// Accounts writes /etc/passwd and /etc/group with root and the given
// users, each with a group of its own id.
func Accounts(users map[string]int) []File {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n"
	group := "root:x:0:\n"
	names := make([]string, 0, len(users))
	for n := range users {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		id := users[n]
		passwd += fmt.Sprintf("%s:x:%d:%d:%s:/nonexistent:/sbin/nologin\n", n, id, id, n)
		group += fmt.Sprintf("%s:x:%d:\n", n, id)
	}
	return []File{
		{Path: "/etc/passwd", Data: []byte(passwd)},
		{Path: "/etc/group", Data: []byte(group)},
		{Path: "/etc/nsswitch.conf", Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
	}
}
