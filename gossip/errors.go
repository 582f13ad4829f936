package gossip

import "errors"

var (
	// ErrMalformed is wrapped by every decoding error caused by bad bytes.
	ErrMalformed = errors.New("gossip: malformed message")
	// ErrVersion is wrapped when a message carries a codec version this build
	// does not understand.
	ErrVersion = errors.New("gossip: unsupported version")
	// ErrForeign is wrapped when a message does not start with the gossip
	// magic: it was not written by this package.
	ErrForeign = errors.New("gossip: foreign message")
	// ErrMetaTooLarge is returned when the encoded node meta exceeds
	// MaxMetaBytes.
	ErrMetaTooLarge = errors.New("gossip: node meta too large")
	// ErrInvalidConfig is wrapped by every Config.Validate error.
	ErrInvalidConfig = errors.New("gossip: invalid config")
	// ErrInvalidKeyring is wrapped by errors about a keyring file or keys.
	ErrInvalidKeyring = errors.New("gossip: invalid keyring")
	// ErrNoEncryption: keys cannot be installed in a member that started
	// without encryption.
	ErrNoEncryption = errors.New("gossip: started without encryption; a key needs a restart")
	// ErrAlreadyRunning is returned by a second call to Run.
	ErrAlreadyRunning = errors.New("gossip: already running")
)
