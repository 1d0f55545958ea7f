module github.com/idem-go/idem/scripts/modproxy

go 1.26.0
