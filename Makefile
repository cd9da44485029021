# drove: the two commands of the README.
#   make demo   install what is needed, build, start a 3-node cluster and use a disk
#   make test   the whole test suite (what CI runs)
#   make deb    the Debian package (docs/install.md); prints its path
.PHONY: demo test deps build bench deb clean

demo: deps build
	bash scripts/demo.sh

test: deps build
	bash scripts/test.sh

deps:
	bash scripts/install-deps.sh

build:
	cargo build --release --locked --bin drove

deb: build
	bash packaging/deb/build.sh

bench: deps build
	bash bench/run.sh

clean:
	cargo clean
