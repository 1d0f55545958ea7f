// Package ledgertest is the conformance suite of idem's ledger drivers: a
// driver of idem.Ledger and idem.LedgerTx runs it in its own tests, as
// River's drivers run riverdrivertest, and so can a third party's driver.
// Its subpackage dbtest starts the real servers the tests need.
package ledgertest
