// Package cli holds what the two daemons' command lines share: configuration
// loading with viper (config file, environment, flags, in that order of
// precedence from lowest to highest), validation errors that name the bad key
// and where its value came from, human sizes, table and JSON output, and zap
// logger construction.
//
// It is not for command logic: each command lives in cmd/ and only wires a
// package (pool, pager, ...) to the values it reads through an App.
package cli
