// Package hack holds the repository's build, install and test scripts; its
// tests check what the scripts say to a user. It has no Go API.
package hack
