package faultconn

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
)

// errNotRESP is returned for bytes that are not the RESP this package
// understands.
var errNotRESP = errors.New("faultconn: not RESP")

// maxLen bounds the lengths and counts the parsers accept, so that garbage
// cannot make them wait for more data forever or overflow.
const maxLen = 1 << 32

// parseCommand parses the RESP array of bulk strings that a client sends as
// a command at the start of b. It returns the command (name upper-cased)
// and its length in bytes, or n == 0 if b holds only part of a command.
// An empty array yields an empty cmd with n > 0.
func parseCommand(b []byte) (cmd []string, n int, err error) {
	if len(b) == 0 {
		return nil, 0, nil
	}
	if b[0] != '*' {
		return nil, 0, errNotRESP
	}
	count, i, err := readLength(b, 1)
	if err != nil || i < 0 {
		return nil, 0, err
	}
	if count < 0 {
		return nil, 0, errNotRESP
	}
	cmd = make([]string, 0, min(count, 64))
	for range count {
		if i >= len(b) {
			return nil, 0, nil
		}
		if b[i] != '$' {
			return nil, 0, errNotRESP
		}
		size, next, err := readLength(b, i+1)
		if err != nil || next < 0 {
			return nil, 0, err
		}
		if size < 0 {
			return nil, 0, errNotRESP
		}
		end := next + size
		if end+2 > len(b) {
			return nil, 0, nil
		}
		if b[end] != '\r' || b[end+1] != '\n' {
			return nil, 0, errNotRESP
		}
		cmd = append(cmd, string(b[next:end]))
		i = end + 2
	}
	if len(cmd) > 0 {
		cmd[0] = strings.ToUpper(cmd[0])
	}
	return cmd, i, nil
}

// readLength reads the decimal number that ends with CRLF at b[i:]. It
// returns the number and the index after the CRLF, or next == -1 if the
// line is not complete yet.
func readLength(b []byte, i int) (v, next int, err error) {
	j := bytes.IndexByte(b[i:], '\n')
	if j < 0 {
		if len(b)-i > 21 {
			return 0, 0, errNotRESP
		}
		return 0, -1, nil
	}
	end := i + j
	if end == i || b[end-1] != '\r' {
		return 0, 0, errNotRESP
	}
	v, err = strconv.Atoi(string(b[i : end-1]))
	if err != nil || v < -1 || v > maxLen {
		return 0, 0, errNotRESP
	}
	return v, end + 1, nil
}

// replyEnd returns the length of the complete RESP2 or RESP3 value at the
// start of b, or 0 if b holds only part of one. Attributes (|) count as
// part of the value they precede.
func replyEnd(b []byte) (int, error) {
	end, err := valueEnd(b, 0, 0)
	if err != nil {
		return 0, err
	}
	if end < 0 {
		return 0, nil
	}
	return end, nil
}

// maxDepth bounds the nesting of aggregates valueEnd follows.
const maxDepth = 64

// valueEnd returns the index just after the value that starts at b[i], or
// -1 if it is incomplete.
func valueEnd(b []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errNotRESP
	}
	if i >= len(b) {
		return -1, nil
	}
	switch b[i] {
	case '+', '-', ':', ',', '#', '(', '_':
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1, nil
		}
		if j == 0 || b[i+j-1] != '\r' {
			return 0, errNotRESP
		}
		return i + j + 1, nil
	case '$', '!', '=':
		size, next, err := readLength(b, i+1)
		if err != nil || next < 0 {
			return -1, err
		}
		if size < 0 {
			return next, nil // RESP2 null bulk string
		}
		end := next + size
		if end+2 > len(b) {
			return -1, nil
		}
		if b[end] != '\r' || b[end+1] != '\n' {
			return 0, errNotRESP
		}
		return end + 2, nil
	case '*', '~', '>', '%', '|':
		count, next, err := readLength(b, i+1)
		if err != nil || next < 0 {
			return -1, err
		}
		if count < 0 {
			return next, nil // RESP2 null array
		}
		if b[i] == '%' || b[i] == '|' {
			count *= 2
		}
		for range count {
			next, err = valueEnd(b, next, depth+1)
			if err != nil || next < 0 {
				return -1, err
			}
		}
		if b[i] == '|' {
			// An attribute is followed by the value it describes.
			return valueEnd(b, next, depth+1)
		}
		return next, nil
	default:
		return 0, errNotRESP
	}
}
