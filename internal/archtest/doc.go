// Package archtest holds no code: its tests keep the package boundaries of
// docs/architecture.md true, and none of them can pass by checking nothing.
// They read the module's packages as `go list -deps` sees them (what each
// builds from, tests left out) and check:
//
//   - layers (layers_test.go): every package of the module is placed in
//     exactly one layer, and every package of the module it reaches,
//     directly or through others, is in a layer its line names; a failure
//     names the chain (a → b → c). knownOnlyTo lists the packages only
//     named packages may import (the container wall: internal/system and
//     internal/doctor), bans the libraries a package must not reach.
//   - no Kubernetes (layers_test.go): no package of the module reaches a
//     library under k8s.io/ or sigs.k8s.io/; the cluster side is the k8s/
//     module of its own.
//   - the packages table of docs/architecture.md (docs_test.go): every
//     package of the module has one row; every package of the module a
//     row's packages import is named in its imports column, and every
//     package named there is imported by one of them.
//   - package docs (docs_test.go): each sentence of a package doc that
//     says what the package imports is listed in claims, with what it
//     means, and held to it; a doc that speaks of importing where no claim
//     covers it fails, and so does a claim whose sentence is gone.
//
// A rule that names a package that does not exist fails, whichever table
// it is in. A new package gets a line in layers and a row in the table.
//
// How the table names packages: a path inside the module
// ("internal/lifecycle"); "x/..." for x and every package beneath it;
// braces for siblings ("internal/image/{rootfs,unpack}"). The imports
// column is a comma-separated list of names: anything in parentheses is a
// note, a name whose first element is not a directory of the module
// ("x/sys", "stdlib") is a library and not checked.
package archtest
